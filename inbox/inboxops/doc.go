// Package inboxops is the inbox as an operator tool sees it. Store reads and pages its
// rows. Replay runs quarantined rows again through an inbox's handler, and records the
// replay in the replay table. Cleaner is the retention cleaner. The runtime's command line
// and console use the package, and a plugin needs none of it.
package inboxops

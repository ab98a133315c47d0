// Package inboxops is the inbox as an operator tool sees it: its rows read and paged
// (Store), quarantined rows replayed through an inbox's handler (Replay, recorded in the
// replay table), and the retention cleaner (Cleaner). The runtime's command line and
// console use it; a plugin needs none of it.
package inboxops

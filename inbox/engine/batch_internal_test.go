package engine

import "testing"

func TestReturningSupported(t *testing.T) {
	for v, want := range map[string]bool{
		"10.11.14-MariaDB-0+deb12u2": true,
		"10.5.0-MariaDB":             true,
		"11.4.2-MariaDB-log":         true,
		"10.4.34-MariaDB":            false,
		"5.5.5-10.11.6-MariaDB":      false, // the old replication prefix: not parsed as 10.11, so the safe path
		"8.0.36":                     false, // MySQL: no INSERT … RETURNING
		"8.4.0-0ubuntu":              false,
		"":                           false,
	} {
		if got := returningSupported(v); got != want {
			t.Errorf("returningSupported(%q) = %v, want %v", v, got, want)
		}
	}
}

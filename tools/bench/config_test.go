package main

import "testing"

// TestTargetsSizes: -targets runs the groups of the targets line at their shorter sizes,
// and a flag given on the command line wins over them.
func TestTargetsSizes(t *testing.T) {
	c, err := parseConfig([]string{"-targets", "-peer-orders", "5000"})
	if err != nil {
		t.Fatal(err)
	}
	if c.only != targetsGroups || c.peerN != 5000 || c.forwarderN != 10000 || c.relayShards != 1 || c.routerBig != 0 || c.routerPayloads != 0 {
		t.Errorf("-targets: only %q, peer %d, forwarder %d, relay shards %d, big %d, payloads %d", c.only, c.peerN, c.forwarderN, c.relayShards, c.routerBig, c.routerPayloads)
	}
	if c.routerN != 50000 || c.routerRate != 2000 || c.idleSecs != 30 {
		t.Errorf("-targets changed the router group's peak (%d orders) or rate (%d/s), or the idle seconds (%d)", c.routerN, c.routerRate, c.idleSecs)
	}
	for _, g := range []string{"relay", "peer", "router", "idle", "scaleout", "targets"} {
		if !c.want(g) {
			t.Errorf("-targets leaves out %s", g)
		}
	}
	if c.want("e2e") || c.want("batch") {
		t.Error("-targets runs e2e or batch")
	}
	c, err = parseConfig([]string{"-targets", "-only", "router,targets"})
	if err != nil || c.only != "router,targets" {
		t.Errorf("-targets -only router,targets: only %q, %v", c.only, err)
	}
	c, err = parseConfig(nil)
	if err != nil || c.only != "" || c.targets || c.peerN != 50000 {
		t.Errorf("no flags: only %q, targets %t, peer %d, %v", c.only, c.targets, c.peerN, err)
	}
}

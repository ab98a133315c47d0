package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// heal ends every fault: no proxy faults, the services up, the routers that are always
// wanted running, the one that joins and leaves gone.
func (h *harness) heal() {
	if h.px != nil {
		h.px.Heal()
	}
	if h.kpx != nil {
		h.kpx.Heal()
	}
	for _, s := range h.slots {
		s.disarm()
	}
	h.infraMu.Lock()
	if err := h.infra("up"); err != nil {
		h.harnessErr("infra.sh up after the faults: %v", err)
	}
	if h.p.galera {
		if err := h.infra("galera-up"); err != nil {
			h.harnessErr("infra.sh galera-up after the faults: %v", err)
		}
	}
	h.infraMu.Unlock()
	h.slots[len(h.slots)-1].stop(40 * time.Second)
	for _, s := range h.slots[:len(h.slots)-1] {
		s.start()
	}
}

// recordFaults counts what the faults did into the run's info, logs it and saves run.json.
func (h *harness) recordFaults() {
	kills, unplanned, crashes, armed := 0, 0, 0, 0
	for _, s := range h.slots {
		s.mu.Lock()
		kills += s.kills
		unplanned += s.unplanned
		crashes += s.crashes
		armed += s.arms
		s.mu.Unlock()
	}
	info := &h.info
	info.Kills, info.BrokerRestar, info.DBRestarts = kills, int(h.brokerRestarts.Load()), int(h.dbRestarts.Load())
	info.Faults = map[string]string{
		"kills":         fmt.Sprintf("%d SIGKILLs: %d from kill faults, the rest from relay-crash faults", kills, h.scheduledKills.Load()),
		"relay_crashes": fmt.Sprintf("%d of %d relay-crash faults crashed a router right after a Kafka commit", crashes, armed),
		"db_proxy":      "not proxied",
		"kafka_proxy":   "not proxied",
	}
	if h.px != nil {
		info.Faults["db_proxy"] = h.px.Stats()
	}
	info.DBNodeKills = int(h.dbNodeKills.Load())
	if h.kpx != nil {
		info.Faults["kafka_proxy"] = h.kpx.Stats()
	}
	h.logf("faults over: kills=%d broker_restarts=%d db_restarts=%d db_node_kills=%d relay_crashes=%d/%d unplanned_router_exits=%d; healing and draining (≤ %s)",
		kills, info.BrokerRestar, info.DBRestarts, info.DBNodeKills, crashes, armed, unplanned, h.p.drain)
	h.logf("network faults: db proxy %s; kafka proxy %s", info.Faults["db_proxy"], info.Faults["kafka_proxy"])
	if h.p.cluster {
		h.cl.mu.Lock()
		c := h.cl.counts
		h.cl.mu.Unlock()
		c.Rebalances = int(h.cl.churns.Load())
		info.Cluster = &c
		h.logf("cluster faults: broker_kills=%d order_paid_leader_kills=%d coupon_granted_leader_kills=%d coordinator_kills=%d mid_transaction_kills=%d node_restarts=%d rebalances=%d",
			c.brokerKills(), c.LeaderKills[orderTopic], c.LeaderKills[grantedTopic], c.CoordKills, c.MidTxnKills, c.NodeRestarts, c.Rebalances)
	}
	saveInfo(h.o.runDir, *info)
}

// settle waits (bounded by the profile's drain) until the run's work is done and its
// offsets committed, then stops the routers.
func (h *harness) settle(ctx context.Context) {
	drainStart := time.Now()
	drained, why := drain(ctx, h.appDSN, h.info, h.p.drain)
	if h.rssStop != nil {
		// The RSS figures go into the run's info (recorded before the drain) once summarized.
		close(h.rssStop)
		h.rssStop = nil
		<-h.rssDone
		if c := h.info.Cluster; c != nil {
			h.cl.mu.Lock()
			r := h.cl.counts
			h.cl.mu.Unlock()
			c.RSSMaxMB, c.RSSGrowthMB, c.RSSBuckets, c.RSSSamples, c.Processed, c.BrokerRSSMaxMB = r.RSSMaxMB, r.RSSGrowthMB, r.RSSBuckets, r.RSSSamples, r.Processed, r.BrokerRSSMaxMB
			saveInfo(h.o.runDir, h.info)
		}
	}
	if drained {
		h.logf("drained: %s", why)
		// Offsets are committed every second: wait (bounded) until every group of the run
		// has committed the end of every partition while the routers still run. The checker
		// reads them again after the routers stopped.
		lags, err := waitLag(ctx, h.o.brokers, groupsOf(h.info), h.info.StartOffsets, max(h.p.drain-time.Since(drainStart), 30*time.Second))
		if err != nil {
			h.logf("committed offsets: %v", err)
		} else {
			h.logf("committed offsets before stopping the routers: %s", lagSummary(lags))
		}
	} else {
		h.harnessErr("not drained after %s: %s", h.p.drain, why)
	}
	h.closeFleet()
	h.logf("routers stopped")
}

// checkFaultCounts fails the run (as the harness's error) when fewer faults happened than
// the profile wants.
func (h *harness) checkFaultCounts() {
	if sk := int(h.scheduledKills.Load()); sk < h.p.minKills {
		h.harnessErr("only %d kills from kill faults, profile %s wants ≥ %d", sk, h.p.name, h.p.minKills)
	}
	if h.info.DBNodeKills < h.p.dbNodeKills {
		h.harnessErr("galera node kills %d/%d", h.info.DBNodeKills, h.p.dbNodeKills)
	}
	if h.info.BrokerRestar < h.p.brokerRestarts || h.info.DBRestarts < h.p.dbRestarts {
		h.harnessErr("restarts: broker %d/%d, db %d/%d", h.info.BrokerRestar, h.p.brokerRestarts, h.info.DBRestarts, h.p.dbRestarts)
	}
	if c := h.info.Cluster; c != nil {
		if c.LeaderKills[orderTopic] < h.p.leaderKills || c.LeaderKills[grantedTopic] < h.p.leaderKills || c.CoordKills < h.p.coordKills {
			h.harnessErr("broker kills: leader of %s %d/%d, leader of %s %d/%d, coordinator %d/%d", orderTopic, c.LeaderKills[orderTopic], h.p.leaderKills,
				grantedTopic, c.LeaderKills[grantedTopic], h.p.leaderKills, c.CoordKills, h.p.coordKills)
		}
	}
}

// drain waits until every ledger order is terminal or quarantined, has its row done or
// failed in the misbehaving plugin's inbox, no inbox row of the run is processing, and the
// outbox is published (own SQL, direct to the database).
func drain(ctx context.Context, appDSN string, info runInfo, bound time.Duration) (bool, string) {
	total := 0
	for _, l := range info.Ledgers {
		lf, err := readLedger(l)
		if err != nil {
			return false, err.Error()
		}
		total += len(lf.orders)
	}
	db, err := openDB(appDSN)
	if err != nil {
		return false, err.Error()
	}
	defer db.Close()
	like := likePrefix(info.Prefix)
	deadline := time.Now().Add(bound)
	why := ""
	for {
		var terminal, quarantined, processing, pending, misbehaved, delayed int
		err := db.QueryRowContext(ctx, rebind(db, `SELECT
 (SELECT COUNT(*) FROM coupon_grant WHERE order_id LIKE ? AND state IN ('GRANTED', 'FAILED')),
 (SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND dedup_key LIKE ? AND status = 'failed' AND COALESCE(reason, '') <> 'delayed' AND dedup_key NOT LIKE '%#conflict:%'),
 (SELECT COUNT(*) FROM inbox WHERE biz_type IN ('coupon', ?) AND dedup_key LIKE ? AND status = 'processing'),
 (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL),
 (SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND dedup_key LIKE ? AND status IN ('done', 'failed') AND COALESCE(reason, '') <> 'delayed' AND dedup_key NOT LIKE '%#conflict:%'),
 (SELECT COUNT(*) FROM inbox WHERE biz_type IN ('coupon', ?) AND dedup_key LIKE ? AND status = 'failed' AND reason = 'delayed')`),
			like, like, misbehaverBiz, like, misbehaverBiz, like, misbehaverBiz, like).Scan(&terminal, &quarantined, &processing, &pending, &misbehaved, &delayed)
		if err == nil {
			why = fmt.Sprintf("%d/%d orders terminal, %d quarantined, %d/%d ended in %s's inbox, %d processing, %d waiting for a delayed redelivery, %d outbox rows unpublished",
				terminal, total, quarantined, misbehaved, total, misbehaverPlugin, processing, delayed, pending)
			if terminal+quarantined >= total && (misbehaved >= total || info.NoMisbehaver) && processing == 0 && delayed == 0 && pending == 0 {
				return true, why
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, why
		}
		time.Sleep(time.Second)
	}
}

func saveInfo(dir string, info runInfo) {
	b, _ := json.MarshalIndent(info, "", "  ")
	_ = os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
}

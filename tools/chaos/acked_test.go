package main

import (
	"os"
	"path/filepath"
	"testing"
)

// ackedSkipped sums the acked offsets of one consumer group's claims across the routers'
// logs, and leaves out other groups' claims and other lines.
func TestAckedSkipped(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	line := func(group, offsets string) string {
		return `time=2026-12-07T21:15:49.702Z level=INFO msg="Partition claimed with messages acked past its committed offset; they are not handed out again" acked_runs=1 consumer_group=` +
			group + ` acked_offsets=` + offsets + ` topic=order-paid kafka_partition=3` + "\n"
	}
	write("router-a-01.log", line("coupon-sender", "30")+"time=x level=INFO msg=\"Partition claimed\" consumer_group=coupon-sender\n"+line("chaos-misbehaver", "7"))
	last := line("coupon-sender", "1")
	write("router-b-01.log", line("coupon-sender", "12")+last[:len(last)-1]) // a last line without its newline counts too
	write("other.log", line("coupon-sender", "1000"))
	claims, n, err := ackedSkipped(dir, "coupon-sender")
	if err != nil || claims != 3 || n != 43 {
		t.Fatalf("ackedSkipped = %d claims, %d offsets, %v; want 3, 43, nil", claims, n, err)
	}
	if claims, n, _ := ackedSkipped(dir, "chaos-misbehaver"); claims != 1 || n != 7 {
		t.Fatalf("chaos-misbehaver: %d claims, %d offsets; want 1, 7", claims, n)
	}
}

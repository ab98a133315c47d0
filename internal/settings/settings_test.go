package settings

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

type lib struct {
	Table    string        // not a setting
	Size     int           `key:"size" default:"512" range:"1..10000" help:"size"`
	Linger   time.Duration `key:"linger" default:"2ms" range:"0..1s" zero:"-1ns" help:"linger"`
	Ratio    float64       `key:"ratio" default:"1" range:"0..1" help:"ratio"`
	Budget   int64         `key:"budget" default:"67108864" range:"1..1099511627776" help:"budget"`
	Brokers  []string      `key:"brokers" default:"a:1,b:2" help:"brokers"`
	TLS      tlsPart       `key:"tls"`
	Hook     func()
	internal int
}

type tlsPart struct {
	Enabled bool   `key:"enabled" help:"on"`
	CAFile  string `key:"ca_file" help:"ca"`
}

type other struct {
	Workers int `key:"workers" default:"2" range:"1..64" help:"workers"`
}

type root struct {
	On      bool                      `key:"on" default:"true" help:"on"`
	Lib     lib                       `key:",squash"`
	Other   other                     `key:",squash"`
	Own     string                    `key:"own" after:"size" help:"own"`
	Last    string                    `key:"last" after:"own" help:"last"`
	Plugins map[string]map[string]any `key:"plugins"`
}

type wrapper struct {
	Section root `key:"section"`
}

func keys(ss []Setting) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Key)
	}
	return out
}

func TestList(t *testing.T) {
	got := keys(List(wrapper{}))
	want := []string{"section.on", "section.size", "section.own", "section.last", "section.linger", "section.ratio", "section.budget",
		"section.brokers", "section.tls.enabled", "section.tls.ca_file", "section.workers"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keys\n got %v\nwant %v", got, want)
	}
	if got := keys(List(&lib{})); got[0] != "size" || got[6] != "tls.ca_file" {
		t.Errorf("a library's own keys: %v", got)
	}
	type alone struct {
		A string `key:"a" help:"a"`
		B string `key:"b" after:"elsewhere" help:"b"`
		C string `key:"c" help:"c"`
	}
	if got := keys(List(alone{})); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("after a key not listed: %v, want field order", got)
	}
}

func TestSetDefaults(t *testing.T) {
	var w wrapper
	SetDefaults(&w)
	l := w.Section.Lib
	if !w.Section.On || l.Size != 512 || l.Linger != 2*time.Millisecond || l.Ratio != 1 || l.Budget != 64<<20 ||
		!reflect.DeepEqual(l.Brokers, []string{"a:1", "b:2"}) || l.TLS.Enabled || l.Table != "" || w.Section.Other.Workers != 2 {
		t.Fatalf("defaults: %+v", w)
	}
	l.Brokers[0] = "changed" // a copy, so the next defaults are unchanged
	var again lib
	SetDefaults(&again)
	if again.Brokers[0] != "a:1" {
		t.Fatalf("the default list was shared: %v", again.Brokers)
	}
	set := lib{Size: 7, Linger: -1}
	SetDefaults(&set)
	if set.Size != 7 || set.Linger != -1 {
		t.Fatalf("set values overwritten: %+v", set)
	}
}

func TestResolve(t *testing.T) {
	l := lib{Size: 1}
	Resolve(&l)
	if l.Linger != -1 || l.Ratio != 0 {
		t.Fatalf("a configured 0: linger %s (want its zero value -1ns), ratio %g (no zero tag: stays 0)", l.Linger, l.Ratio)
	}
}

func TestCheck(t *testing.T) {
	ok := func() wrapper { var w wrapper; SetDefaults(&w); return w }
	cases := []struct {
		name string
		set  func(*wrapper)
		want string
	}{
		{"defaults", func(*wrapper) {}, ""},
		{"edges", func(w *wrapper) {
			w.Section.Lib.Size, w.Section.Lib.Linger, w.Section.Lib.Ratio = 10000, time.Second, 0
		}, ""},
		{"linger off", func(w *wrapper) { w.Section.Lib.Linger = -1 }, ""},
		{"above", func(w *wrapper) { w.Section.Lib.Size = 10001 }, "section.size 10001 outside 1..10000"},
		{"below", func(w *wrapper) { w.Section.Other.Workers = 0 }, "section.workers 0 outside 1..64"},
		{"duration", func(w *wrapper) { w.Section.Lib.Linger = 2 * time.Second }, "section.linger 2s outside 0s..1s"},
		{"negative, not the zero value", func(w *wrapper) { w.Section.Lib.Linger = -2 }, "section.linger -2ns outside 0s..1s"},
		{"float", func(w *wrapper) { w.Section.Lib.Ratio = 1.5 }, "section.ratio 1.5 outside 0..1"},
		{"int64", func(w *wrapper) { w.Section.Lib.Budget = 0 }, "section.budget 0 outside 1..1099511627776"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := ok()
			tc.set(&w)
			err := Check(w)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var oe *OutsideError
			if err == nil || err.Error() != tc.want || !errors.As(err, &oe) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// A library checks its own struct, so its keys have no router's section.
	if err := Check(lib{Linger: time.Millisecond, Ratio: 1, Budget: 1}); err == nil || err.Error() != "size 0 outside 1..10000" {
		t.Fatalf("library level: %v", err)
	}
}

func TestCheckNaN(t *testing.T) {
	var l lib
	SetDefaults(&l)
	l.Ratio = zeroF() / zeroF()
	if err := Check(l); err == nil || !strings.Contains(err.Error(), "ratio NaN outside 0..1") {
		t.Fatalf("NaN: %v", err)
	}
}

func zeroF() float64 { return 0 }

// TestMalformedTags checks that malformed declarations panic when the struct is first
// listed.
func TestMalformedTags(t *testing.T) {
	type badRange struct {
		X int `key:"x" range:"5"`
	}
	type emptyRange struct {
		X int `key:"x" range:"5..1"`
	}
	type badDefault struct {
		X time.Duration `key:"x" default:"10"`
	}
	type defaultOutside struct {
		X int `key:"x" default:"0" range:"1..2"`
	}
	type rangeOnText struct {
		X string `key:"x" range:"1..2"`
	}
	type unsupported struct {
		X uint `key:"x"`
	}
	type twice struct {
		A other `key:",squash"`
		B other `key:",squash"`
	}
	for _, v := range []any{badRange{}, emptyRange{}, badDefault{}, defaultOutside{}, rangeOnText{}, unsupported{}, twice{}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%T listed without a panic", v)
				}
			}()
			List(v)
		}()
	}
}

func TestText(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{720 * time.Hour, "720h"}, {time.Minute, "1m"}, {90 * time.Second, "1m30s"}, {100 * time.Millisecond, "100ms"},
		{[]string{"a", "b"}, "a,b"}, {1.0, "1"}, {false, "false"}, {"", ""}, {int64(64 << 20), "67108864"},
	} {
		if got := Text(c.v); got != c.want {
			t.Errorf("Text(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

// TestParse checks that Parse reports what List panics on, for declarations checked as a
// program starts. Only a struct is a declaration.
func TestParse(t *testing.T) {
	type badRange struct {
		X int `key:"x" range:"5"`
	}
	if _, err := Parse(badRange{}); err == nil || !strings.Contains(err.Error(), `range "5": want min..max`) {
		t.Errorf("a malformed range: %v", err)
	}
	type badSquash struct {
		X int `key:",squash"`
	}
	if _, err := Parse(&badSquash{}); err == nil || !strings.Contains(err.Error(), "squash of a int") {
		t.Errorf("a squashed int: %v", err)
	}
	for _, v := range []any{nil, 3, map[string]any{}} {
		if _, err := Parse(v); err == nil || !strings.Contains(err.Error(), "no struct") {
			t.Errorf("Parse(%#v): %v, want no struct", v, err)
		}
	}
	if got, err := Parse(&lib{}); err != nil || len(got) != 7 {
		t.Errorf("a library: %d settings, %v", len(got), err)
	}
}

// TestUint64 checks that a uint64 setting has a default, a range and a check of its own
// type.
func TestUint64(t *testing.T) {
	type seeded struct {
		Seed uint64 `key:"seed" default:"7" range:"1..18446744073709551615" help:"seed"`
	}
	var s seeded
	SetDefaults(&s)
	if s.Seed != 7 || Check(s) != nil {
		t.Fatalf("default %d, check %v", s.Seed, Check(s))
	}
	s.Seed = 1<<64 - 1
	if err := Check(s); err != nil {
		t.Fatalf("the top of the range: %v", err)
	}
	if err := Check(seeded{}); err == nil || err.Error() != "seed 0 outside 1..18446744073709551615" {
		t.Fatalf("below the range: %v", err)
	}
}

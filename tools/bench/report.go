package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// result is one reported measurement: its name and its fields in the order reported.
type result struct {
	name   string
	fields [][2]string
}

// report prints one BENCH line (tagged with the round, if one is running) and keeps it for
// the CSV and the chart. kv alternates keys and values; float64 values get one decimal.
func (s *suite) report(name string, kv ...any) {
	r := result{name: name}
	line := "BENCH name=" + name
	if s.round > 0 {
		kv = append([]any{"round", s.round}, kv...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v := fmt.Sprint(kv[i+1])
		if f, ok := kv[i+1].(float64); ok {
			v = strconv.FormatFloat(f, 'f', 1, 64)
		}
		r.fields = append(r.fields, [2]string{fmt.Sprint(kv[i]), v})
		line += fmt.Sprintf(" %s=%s", kv[i], v)
	}
	s.results = append(s.results, r)
	fmt.Println(line)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// writeCSV writes the run's chart and its results (one row per field: name, key, value)
// under -out, both named by the time.
func (s *suite) writeCSV() error {
	outDir := s.cfg.outDir
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	stamp := time.Now().UTC().Format("20060102-150405")
	png := filepath.Join(outDir, "bench-"+stamp+".png")
	if err := writeChart(png, chartPanels(s.results)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	// The latest full run's chart under a stable name, beside the CSV the documents' tables
	// come from (-only runs leave it).
	if s.cfg.only == "" {
		if err := writeChart(filepath.Join(outDir, "latest.png"), chartPanels(s.results)); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	fmt.Printf("bench: chart written to %s\n", png)
	path := filepath.Join(outDir, "bench-"+stamp+".csv")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"name", "key", "value"})
	for _, r := range s.results {
		for _, kv := range r.fields {
			_ = w.Write([]string{r.name, kv[0], kv[1]})
		}
	}
	w.Flush()
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("bench: results written to %s\n", path)
	return w.Error()
}

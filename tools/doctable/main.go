// Command doctable rewrites the generated tables of the documents from a run's results, so
// that the figures the documents show are the figures a run wrote:
//
//	go build -C tools -o ../bin/doctable ./doctable
//	bin/doctable -bench tools/bench/results/bench-<time>.csv
//	bin/doctable -chaos .run/chaos/chaos.log
//
// -bench rewrites the region between <!-- bench-table:start --> and <!-- bench-table:end -->
// of docs/BENCHMARKS.md and the region between <!-- bench-summary:start --> and
// <!-- bench-summary:end --> of README.md from the CSV `make bench` writes (name, key, value:
// one row per field of each BENCH line). -chaos rewrites <!-- chaos-table:start/end --> of
// docs/RELIABILITY.md from the output of `make chaos` (its checker's lines and the CHAOS line).
// Run it from the repository root, or point -root at it. `make bench` and `make chaos` call it.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "doctable: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("doctable", flag.ContinueOnError)
	benchCSV := fs.String("bench", "", "a CSV of make bench (tools/bench/results/bench-<time>.csv)")
	chaosLog := fs.String("chaos", "", "the output of make chaos (.run/chaos/chaos.log)")
	root := fs.String("root", ".", "the repository root")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *benchCSV == "" && *chaosLog == "" {
		return fmt.Errorf("nothing to do: give -bench FILE.csv and/or -chaos FILE.log")
	}
	if *benchCSV != "" {
		f, err := os.Open(*benchCSV)
		if err != nil {
			return err
		}
		recs, err := parseBenchCSV(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *benchCSV, err)
		}
		run := benchRun{source: strings.TrimSuffix(filepath.Base(*benchCSV), ".csv"), recs: recs}
		table, err := run.table()
		if err != nil {
			return fmt.Errorf("%s: %w", *benchCSV, err)
		}
		if err := rewrite(filepath.Join(*root, "docs", "BENCHMARKS.md"), "bench-table", table); err != nil {
			return err
		}
		if err := rewrite(filepath.Join(*root, "README.md"), "bench-summary", run.summary()); err != nil {
			return err
		}
		fmt.Printf("doctable: docs/BENCHMARKS.md and README.md from %s\n", *benchCSV)
	}
	if *chaosLog != "" {
		b, err := os.ReadFile(*chaosLog)
		if err != nil {
			return err
		}
		c, err := parseChaosLog(string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", *chaosLog, err)
		}
		if err := rewrite(filepath.Join(*root, "docs", "RELIABILITY.md"), c.region(), c.table()); err != nil {
			return err
		}
		fmt.Printf("doctable: docs/RELIABILITY.md from %s\n", *chaosLog)
	}
	return nil
}

// rewrite replaces the text between <!-- name:start --> and <!-- name:end --> of path.
func rewrite(path, name, content string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := replaceRegion(b, name, content)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if bytes.Equal(out, b) {
		return nil
	}
	return os.WriteFile(path, out, 0o644)
}

// replaceRegion returns doc with the lines between the region's markers replaced by content.
func replaceRegion(doc []byte, name, content string) ([]byte, error) {
	start, end := "<!-- "+name+":start -->", "<!-- "+name+":end -->"
	s := bytes.Index(doc, []byte(start))
	e := bytes.Index(doc, []byte(end))
	if s < 0 || e < 0 || e < s {
		return nil, fmt.Errorf("no region %s … %s", start, end)
	}
	var out bytes.Buffer
	out.Write(doc[:s+len(start)])
	out.WriteString("\n")
	out.WriteString(strings.TrimRight(content, "\n"))
	out.WriteString("\n")
	out.Write(doc[e:])
	return out.Bytes(), nil
}

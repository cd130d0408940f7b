// Command lockfs-bench runs lockfs's benchmark harness (package bench):
// it prints the table of figures and writes them as one JSON object,
// merged into the one already in the -out file (each run replaces the keys
// it measures). `make bench` runs it from the repository root as
//
//	go run ./bench/cmd/lockfs-bench -out bench/results.json
//
// and `make bench-scale` adds -scale (1,000 hosts on GCS and on etcd, 100,000
// held locks).
//
// It must run as root on Linux with fuse3 installed, from inside the lockfs
// module (it builds its helper binaries with the go command).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/bench"
)

func main() {
	bench.HelperMain() // the harness re-executes this binary as a GCS holder host

	out := flag.String("out", "bench/results.json", "where to write the results as JSON (empty: nowhere)")
	table := flag.String("table", "", "also write the table (Markdown) to this file")
	reps := flag.Int("reps", 0, "repetitions per comparison (default 5; GCS 4)")
	only := flag.String("only", "", "comma-separated measurements to run: "+strings.Join(bench.Measurements, ","))
	smoke := flag.Bool("smoke", false, "tiny sizes, one repetition: check that the harness works")
	scale := flag.Bool("scale", false, "the scale measurements only (make bench-scale: "+strings.Join(bench.ScaleMeasurements, ",")+"), about 30-45 minutes")
	workDir := flag.String("workdir", "", "parent of the run's temporary directory (a local disk; default $TMPDIR)")
	quiet := flag.Bool("q", false, "no progress lines on standard error")
	flag.Parse()

	cfg := bench.DefaultConfig()
	if *scale {
		cfg = bench.ScaleConfig()
	}
	if *smoke {
		cfg = bench.SmokeConfig()
	}
	if *reps > 0 {
		cfg.Reps, cfg.GCSReps = *reps, *reps
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	cfg.WorkDir = *workDir
	if !*quiet {
		cfg.Log = os.Stderr
	}

	// SIGINT/SIGTERM end the run through its context, so that every mount is
	// cleaned up; a second signal kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()

	start := time.Now()
	res, err := bench.Run(ctx, cfg)
	if res != nil {
		fmt.Println()
		res.WriteTable(os.Stdout)
		fmt.Printf("\n(%v; lockfs and reference columns: median [min–max] over %d repetitions; ratio: median [min–max] of per-repetition ratios)\n",
			time.Since(start).Round(time.Second), cfg.Reps)
		if *out != "" {
			if werr := res.MergeJSON(*out); werr != nil {
				fmt.Fprintln(os.Stderr, "lockfs-bench:", werr)
				os.Exit(1)
			}
			fmt.Println("wrote", *out)
		}
		if *table != "" {
			f, ferr := os.Create(*table)
			if ferr == nil {
				res.WriteTable(f)
				ferr = f.Close()
			}
			if ferr != nil {
				fmt.Fprintln(os.Stderr, "lockfs-bench:", ferr)
				os.Exit(1)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockfs-bench:", err)
		os.Exit(1)
	}
}

// Command pd3 runs the pd3 page store: memory node, host and benchmarks.
// Flag parsing lives here; everything else is in the library packages.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "pd3",
		Short:         "pd3 — pages in remote memory, prefetched by a DPU agent",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var procs int
	root.PersistentFlags().IntVar(&procs, "procs", 0, "OS threads running Go code at once, in this process and the pd3 processes a benchmark starts (GOMAXPROCS; 0: one per CPU). Where pd3 shares a few cores with its memory node and clients, 1 saves the Go scheduler's cross-thread wake-ups (docs/BENCHMARKS.md)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if procs < 0 {
			return fmt.Errorf("--procs %d: want 0 (one per CPU) or more", procs)
		}
		if procs > 0 {
			runtime.GOMAXPROCS(procs)
			// Benchmarks re-execute pd3 for each role; they inherit it.
			os.Setenv("GOMAXPROCS", strconv.Itoa(procs))
		}
		return nil
	}
	root.AddCommand(upCmd(), serveCmd(), mountCmd(), cachestatCmd(), memnodeCmd(), dpuCmd(), pageCmd(), benchCmd())
	// PD3_CPUPROFILE=prefix profiles this process (and the children a
	// benchmark starts) into prefix.<pid>, for `go tool pprof`.
	if prefix := os.Getenv("PD3_CPUPROFILE"); prefix != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
		if err == nil {
			pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "pd3:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

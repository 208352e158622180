// Command pd3 runs the pd3 page store: memory node, host and benchmarks.
// Flag parsing lives here; everything else is in the library packages.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "pd3",
		Short:         "pd3 — pages in remote memory, prefetched by a DPU agent",
		SilenceUsage:  true,
		SilenceErrors: true,
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

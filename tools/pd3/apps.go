package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/tools/bench"
	"github.com/spf13/cobra"
)

// appsCmd is pd3 bench apps: real applications under a memory budget.
func appsCmd(exe func() (string, error), sigctx func(*cobra.Command) (context.Context, context.CancelFunc), emit func(*bench.Report) error, asJSON *bool) *cobra.Command {
	var opt bench.AppsOptions
	var systems, workloads, budgets, pd3Args, nodeArgs string
	c := &cobra.Command{
		Use:   "apps",
		Short: "PostgreSQL, sqlite and fio with their memory held to a budget by a memory cgroup, over each NBD export and on the pd3 mount: pd3 against the ceiling and the plain relay (root)",
		Long: `Runs real applications on a host whose memory is smaller than their data: each
application's processes and the page cache they fill are held to --local-memory
by a memory cgroup (v1 or v2), and every miss reaches the export under test.
Systems take turns in fresh processes, round by round; each row is the median of
--rounds runs with the spread beside it, and the data is checked after every run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opt.Exe, err = exe(); err != nil {
				return err
			}
			opt.Systems, opt.Workloads = strings.Split(systems, ","), strings.Split(workloads, ",")
			opt.Budgets = nil
			for _, b := range strings.Split(budgets, ",") {
				b = strings.TrimSpace(b)
				if b == "none" || b == "0" {
					opt.Budgets = append(opt.Budgets, 0)
					continue
				}
				n, err := units.ParseMultiple(b, pageid.Size)
				if err != nil {
					return usageError{fmt.Errorf("--local-memory %q: %w (a size such as 96MiB, or none)", b, err)}
				}
				if n < 32<<20 {
					return usageError{fmt.Errorf("--local-memory %s: below 32MiB PostgreSQL cannot start; use at least 32MiB", b)}
				}
				opt.Budgets = append(opt.Budgets, n)
			}
			opt.PD3Args, opt.NodeArgs = strings.Fields(pd3Args), strings.Fields(nodeArgs)
			ctx, stop := sigctx(cmd)
			defer stop()
			if watched(*asJSON) {
				opt.Progress = &barProgress{}
			}
			rep, err := bench.Apps(ctx, opt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	f := c.Flags()
	f.StringVar(&systems, "systems", strings.Join(bench.AppsSystems, ","), "exports to compare: "+strings.Join(bench.AppsSystems, ","))
	f.StringVar(&workloads, "workloads", strings.Join(bench.AppsWorkloads, ","), "what runs: "+strings.Join(bench.AppsWorkloads, ","))
	f.StringVar(&budgets, "local-memory", "96MiB", "memory budgets of the application (its processes and page cache), comma-separated; none: no budget")
	f.IntVar(&opt.Scale, "scale", 20, "pgbench scale (about 15 MiB of data each)")
	f.IntVar(&opt.Clients, "clients", 4, "pgbench clients")
	f.DurationVar(&opt.Duration, "duration", 15*time.Second, "each pgbench run")
	pagesVar(f, &opt.Cache, "cache", "64MiB", "pd3 host cache")
	pagesVar(f, &opt.Size, "size", "2GiB", "export size")
	pagesVar(f, &opt.FioSize, "fio-size", "512MiB", "the file the fio workloads read (a multiple of 512KiB)")
	pagesVar(f, &opt.FioIO, "fio-io", "0", "end each of the 4 fio jobs once it has read this much (--duration still bounds it); 0: run for --duration")
	f.DurationVar(&opt.FioWarmup, "fio-warmup", 5*time.Second, "run fio-zipf this long, unmeasured, before its measured run, so that it measures the page cache's steady state under the budget rather than its filling; 0: none")
	f.IntVar(&opt.SqliteRows, "sqlite-rows", 300000, "rows of 1 KiB in the sqlite workloads' table")
	f.IntVar(&opt.TreeFiles, "tree-files", 20000, "files of 1-16 KiB in the tree workloads (tree-tar, tree-grep)")
	f.IntVar(&opt.Rounds, "rounds", 3, "run every system this many times, taking turns in fresh processes; rows are medians")
	f.StringVar(&pd3Args, "pd3-args", "", "extra flags for every pd3 host (e.g. \"--policy clock\")")
	f.StringVar(&nodeArgs, "node-args", "", "extra flags for the memory node of every pd3 NBD system (e.g. \"--poll-for 0\")")
	return c
}

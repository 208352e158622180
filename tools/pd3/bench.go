package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/internal/pacer"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/tools/bench"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func benchCmd() *cobra.Command {
	var asJSON bool
	var plotPath string
	cmd := &cobra.Command{Use: "bench", Short: "Measure pd3 against baselines in one run (ratios)"}
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	class := schedValue("batch")
	cmd.PersistentFlags().Var(&class, "sched", "the --sched of the pd3 processes the benchmark starts (batch or normal); its clients and peers keep the kernel's default class")
	cmd.PersistentFlags().StringVar(&plotPath, "plot", "", "also draw the results into FILE (.png or .svg): throughput per system with ratios, latency percentiles, sweeps as lines")
	// emit prints a report, and draws it with --plot.
	emit := func(rep *bench.Report) error {
		if err := rep.Print(os.Stdout, asJSON); err != nil {
			return err
		}
		if plotPath == "" {
			return nil
		}
		return rep.Plot(plotPath)
	}
	exe := func() (string, error) {
		e, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding the pd3 binary: %w", err)
		}
		return e, nil
	}
	sigctx := func(cmd *cobra.Command) (context.Context, context.CancelFunc) {
		return signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	}

	var reportRun, reportDocs string
	report := &cobra.Command{
		Use:   "report",
		Short: "Run the results page's benchmarks and rewrite docs/BENCHMARKS.md from them",
		Long: `Runs the benchmark of each section of the results page (nbd, fuse, page,
cluster, ec, apps, apps-budgets, apps-fuse, scale: a fixed pd3 bench command
each, three rounds where the benchmark has rounds), keeps each run as
DOCS/bench/NAME.json with its chart DOCS/img/bench-NAME.png, and rewrites DOCS/BENCHMARKS.md from the runs kept: per section the command, the
machine and commit, one table, the chart and the goals met or not. A suite that
fails keeps its previous run. Without --run it only rewrites the page. Root;
all suites take about two hours on the 2-core machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			suites := map[string]bench.Suite{}
			var all []string
			for _, s := range bench.Suites() {
				suites[s.Name] = s
				all = append(all, s.Name)
			}
			var names []string
			switch reportRun {
			case "":
			case "all":
				names = all
			default:
				names = strings.Split(reportRun, ",")
			}
			for _, n := range names {
				if _, ok := suites[n]; !ok {
					return usageError{fmt.Errorf("--run: no suite %q (%s or all)", n, strings.Join(all, ", "))}
				}
			}
			e, err := exe()
			if err != nil {
				return err
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			for _, d := range []string{"bench", "img"} {
				if err := os.MkdirAll(filepath.Join(reportDocs, d), 0o755); err != nil {
					return err
				}
			}
			var failed []string
			for _, n := range names {
				fmt.Fprintf(os.Stderr, "pd3: bench report: running %s\n", n)
				run := bench.RunSuite(ctx, e, suites[n], filepath.Join(reportDocs, "img", "bench-"+n+".png"), os.Stderr)
				if run.Err != "" {
					failed = append(failed, n+": "+run.Err)
					continue
				}
				b, _ := json.MarshalIndent(run, "", "  ")
				if err := os.WriteFile(filepath.Join(reportDocs, "bench", n+".json"), append(b, '\n'), 0o644); err != nil {
					return err
				}
			}
			runs, err := bench.LoadRuns(filepath.Join(reportDocs, "bench"))
			if err != nil {
				return err
			}
			f, err := os.Create(filepath.Join(reportDocs, "BENCHMARKS.md"))
			if err != nil {
				return err
			}
			if err := bench.RenderReport(f, runs); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if len(failed) > 0 {
				return fmt.Errorf("suites failed, their previous runs kept: %s", strings.Join(failed, "; "))
			}
			return nil
		},
	}
	report.Flags().StringVar(&reportRun, "run", "", "suites to run first, comma-separated, or all (none: rewrite the page from the runs kept)")
	report.Flags().StringVar(&reportDocs, "docs", "docs", "the docs directory: bench/, img/ and BENCHMARKS.md in it")
	cmd.AddCommand(report)

	var topt bench.TransportOptions
	transport := &cobra.Command{
		Use:   "transport",
		Short: "4 KiB READs through the memnode protocol vs a raw TCP stream; FAA rate",
		Long: `4 KiB READs through the memory node's protocol against the ceilings of a
server of random pages: raw-random-zc (a stream of pages, no protocol) and
rr-random-zc (32-byte requests answered by a header and a page, one
goroutine at each end). Also: the same READs issued from completion
functions ("4KiB READ fn": no caller to wake, as the host's misses and the
agent's prefetches go), the same reads over mutual TLS (tls/plain, beside
the AES-GCM ceiling measured in the same run), and the 8-byte FAA rate.
With --rounds N the READ and stream systems take N turns and the report
gives medians; rr-random-zc runs between the node's two READ runs, which
swap places each round.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if topt.Exe, err = exe(); err != nil {
				return err
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			rep, err := bench.Transport(ctx, topt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	transport.Flags().DurationVar(&topt.Duration, "duration", 5*time.Second, "measurement time per system")
	transport.Flags().IntVar(&topt.Depth, "depth", 1024, "requests in flight")
	transport.Flags().IntVar(&topt.Rounds, "rounds", 1, "run the READ and stream systems this many times, taking turns, and report each one's median run (ratios of medians)")

	var popt bench.PageOptions
	var systems, dists, workers, sweep, arrivals string
	page := &cobra.Command{
		Use:   "page",
		Short: "Random page GETs over the page protocol, per system",
		Long: `Random page GETs over the page protocol, per system: local (every page in
the host), sync (a miss waits for the memory node), leap (Leap's host-side
prefetcher), pd3 (the embedded agent), pd3-split (the agent in its own
process), relay-local (a byte relay in front of local: the ceiling of any
remote design) and sync-deep (sync with a worker per request in flight:
the ceiling of a host that does a miss's work and no prefetching). The
report gives ratios, host and agent CPU and the host's counters.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if popt.Exe, err = exe(); err != nil {
				return err
			}
			popt.Systems = strings.Split(systems, ",")
			popt.Dists = strings.Split(dists, ",")
			var ok bool
			if popt.Arrivals, ok = pacer.ParseArrivals(arrivals); !ok {
				return fmt.Errorf("--arrivals: %q is neither poisson nor uniform", arrivals)
			}
			if sweep != "" {
				if popt.Sweep, popt.Values, err = bench.ParseSweep(sweep); err != nil {
					return fmt.Errorf("--sweep: %w", err)
				}
			}
			popt.Workers = nil
			for _, w := range strings.Split(workers, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(w))
				if err != nil || n < 0 {
					return fmt.Errorf("--workers: bad value %q", w)
				}
				popt.Workers = append(popt.Workers, n)
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			rep, err := bench.Page(ctx, popt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	fl := page.Flags()
	fl.StringVar(&systems, "systems", "local,sync,leap,pd3", "systems to compare: "+strings.Join(bench.PageSystems, ","))
	pagesVar(fl, &popt.Dataset, "dataset", "1GiB", "bytes of pages")
	pagesVar(fl, &popt.Cache, "cache", "64MiB", "host cache")
	pagesVar(fl, &popt.LZ, "lz", "16MiB", "Loading Zone size for pd3 and leap")
	fl.IntVar(&popt.Clients, "clients", 4, "client connections")
	fl.IntVar(&popt.Depth, "depth", 8, "requests in flight per connection")
	fl.DurationVar(&popt.Duration, "duration", 10*time.Second, "measurement time per system")
	fl.DurationVar(&popt.Warmup, "warmup", 3*time.Second, "unmeasured load before each measurement")
	fl.StringVar(&dists, "dist", "uniform", "key distributions, comma-separated: uniform, zipf:THETA")
	fl.StringVar(&workers, "workers", "0", "server worker counts, comma-separated (0 = one per CPU)")
	fl.Float64Var(&popt.FixedLoad, "fixed-load", 0, "also run every system open-loop at this fraction of sync's peak (e.g. 0.5) and compare p99")
	fl.StringVar(&arrivals, "arrivals", "poisson", "open-loop spacing of GETs: poisson or uniform")
	fl.StringVar(&sweep, "sweep", "", "vary one setting: cache=16MiB..1GiB or lz=1MiB..256MiB (doubling), or a comma list")
	fl.IntVar(&popt.Rounds, "rounds", 1, "run every system this many times, taking turns, and report each one's median run (ratios of medians)")

	var hvopt bench.HostViewOptions
	hv := &cobra.Command{
		Use:   "hostview",
		Short: "Host View lookups: the PD3 Fig. 4 ladder vs Go's map (lookups/s, bytes per key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := sigctx(cmd)
			defer stop()
			rep, err := bench.HostView(ctx, hvopt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	hv.Flags().IntVar(&hvopt.Keys, "keys", 100_000_000, "keys in the set")
	hv.Flags().IntVar(&hvopt.Lookups, "lookups", 20_000_000, "lookups per row")

	var lzopt bench.LZOptions
	var threads string
	lzc := &cobra.Command{
		Use:   "loadingzone",
		Short: "CheckAndReturn hits/s vs a mutex+map and a lock-free scanned ring (PD3 Fig. 8)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lzopt.Threads = nil
			for _, s := range strings.Split(threads, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 {
					return fmt.Errorf("--threads: bad value %q", s)
				}
				lzopt.Threads = append(lzopt.Threads, n)
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			rep, err := bench.LoadingZone(ctx, lzopt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	lzc.Flags().StringVar(&threads, "threads", "1,2,4,8,16", "consumer goroutines, comma-separated")
	lzc.Flags().IntVar(&lzopt.Records, "records", 16384, "pages in the zone")
	lzc.Flags().IntVar(&lzopt.Rounds, "rounds", 5, "fill-and-drain rounds per row")

	var nopt bench.NBDOptions
	var nsystems, njobs string
	var breakdown int
	var breakdownBytes uint64
	var breakdownDPU string
	nbdc := &cobra.Command{
		Use:   "nbd",
		Short: "fio's nbd engine against pd3, nbdkit memory, the nbdkit cache chain over a remote nbdkit, go-nbd (IOPS ratios)",
		Long: `fio's nbd engine against pd3 and its peers, side by side in one run:
nbdkit-memory (a C server holding the data: the ceiling), nbdkit-cache-nbd
(nbdkit's cache filter over its nbd plugin to a second nbdkit holding the
data: the fair remote peer) and its read-ahead variant, pd3-local (the
same host with every page cached: the ceiling of any remote setup) and
go-relay-nbdkit-memory (a Go process that only relays bytes in front of
nbdkit memory, as pd3's host reads a miss: the ceiling of a miss as pd3
makes it). pd3-rN and pd3-ecK+M are volumes replicated N times or erasure
coded K+M over memory nodes in processes of their own and a control plane
(max(2, N) or K+M nodes, measured together: memory/stored is what the nodes
hold per byte of the export). Each system's idle CPU is reported too. --rounds 3 runs every
system three times, taking turns in fresh processes, and reports each
one's median run with the range: one run on a shared VM swings by a fifth.

--breakdown N reads N pages one at a time instead and prints where a
miss's and a hit's time goes, stage by stage, stamped by client, host and
memory node, beside the crossing floor (go-* rows: Go processes that pass
the same frames and do nothing else).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if nopt.Exe, err = exe(); err != nil {
				return err
			}
			nopt.Systems, nopt.Jobs = strings.Split(nsystems, ","), strings.Split(njobs, ",")
			ctx, stop := sigctx(cmd)
			defer stop()
			if breakdown > 0 {
				if plotPath != "" {
					return usageError{fmt.Errorf("--plot draws fio results; --breakdown prints stages")}
				}
				bd, err := bench.NBDBreakdown(ctx, bench.BreakdownOptions{Exe: nopt.Exe, Size: nopt.Size, Cache: nopt.Cache, Requests: breakdown, ReadBytes: breakdownBytes, DPU: breakdownDPU})
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(os.Stdout).Encode(bd)
				}
				bd.Print(os.Stdout)
				return nil
			}
			if watched(asJSON) {
				nopt.Progress = &barProgress{}
			}
			rep, err := bench.NBD(ctx, nopt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	nbdc.Flags().StringVar(&nsystems, "systems", "pd3,nbdkit-memory,nbdkit-cache-nbd,nbdkit-readahead-cache-nbd,pd3-local,go-relay-nbdkit-memory", "servers to compare: "+strings.Join(bench.NBDSystems, ","))
	nbdc.Flags().StringVar(&njobs, "jobs", strings.Join(bench.NBDJobs, ","), "fio jobs (tools/fio/NAME.fio)")
	pagesVar(nbdc.Flags(), &nopt.Size, "size", "1GiB", "export size")
	pagesVar(nbdc.Flags(), &nopt.Cache, "cache", "64MiB", "pd3 host cache")
	nbdc.Flags().DurationVar(&nopt.Runtime, "runtime", 10*time.Second, "per job")
	nbdc.Flags().DurationVar(&nopt.Ramp, "ramp", 2*time.Second, "unmeasured start of each job")
	nbdc.Flags().IntVar(&nopt.Rounds, "rounds", 1, "run every system's jobs this many times, the systems taking turns in fresh processes, and report each one's median run (ratios of medians)")
	nbdc.Flags().IntVar(&breakdown, "breakdown", 0, "instead of fio jobs: read this many pages one at a time and print where each read's time goes, stage by stage (pd3 miss, pd3 hit, nbdkit peers), and each server process's CPU per read")
	nbdc.Flags().StringVar(&breakdownDPU, "breakdown-dpu", "embedded", "with --breakdown: pd3's --dpu (embedded, none)")
	pagesVar(nbdc.Flags(), &breakdownBytes, "breakdown-bytes", "4KiB", "with --breakdown: the size of each read; above a page (a stream at pd3: from --nbd-stream-from) the rows are end-to-end times and CPU per read, without stages")

	var fopt bench.FUSEOptions
	var fsystems, fjobs string
	fusec := &cobra.Command{
		Use:   "fuse",
		Short: "fio and dbench on a pd3 mount against nbdfuse over the nbdkit cache chain and over nbdkit memory, bindfs over tmpfs, tmpfs (ratios; root)",
		Long: `fio and dbench on a pd3 mount against: nbdfuse over the nbdkit cache chain
(remote) and over nbdkit memory, go-fuse-nbdkit (a Go FUSE server that
only relays each request to nbdkit memory: the ceiling of a miss through a
Go FUSE server one hop from its data), bindfs over tmpfs, and tmpfs.
--systems adds pd3 without prefetching, pd3-cached (the whole file in
the host cache: the FUSE path's ceiling) and pd3-oracle (pd3-cached whose
every read also fetches its pages from the memory node, unwaited: a
perfect prefetcher's cost).

The jobs: 1 MiB sequential reads (direct and buffered), 4 KiB random reads
by 1 and 4 threads, a 1 MiB sequential write then fsync, dbench;
seqwrite4k-psync-1-buffered (4 KiB writes), commit4k-psync-1-buffered (a
database committing a page at a time: a 4 KiB overwrite, then fsync) and
files-OP (one metadata operation, OP one of create, write4k, stat, rename,
unlink, on 2000 files). Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if fopt.Exe, err = exe(); err != nil {
				return err
			}
			fopt.Systems, fopt.Jobs = strings.Split(fsystems, ","), strings.Split(fjobs, ",")
			ctx, stop := sigctx(cmd)
			defer stop()
			if watched(asJSON) {
				fopt.Progress = &barProgress{}
			}
			rep, err := bench.FUSE(ctx, fopt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	fusec.Flags().StringVar(&fsystems, "systems", strings.Join(bench.FUSEDefaultSystems(), ","), "what to compare: "+strings.Join(bench.FUSESystems, ","))
	fusec.Flags().StringVar(&fjobs, "jobs", strings.Join(bench.FUSEJobs, ","), "runs: fio as PATTERN-ENGINE-DEPTH-direct|buffered[-THREADS] (PATTERN randread: 4 KiB, seqread1m, seqwrite1m or seqwrite4k: then fsync), dbench-CLIENTS, and files-OP (2000 files, one at a time: OP create, write4k, stat, rename or unlink)")
	pagesVar(fusec.Flags(), &fopt.Size, "size", "1GiB", "file size")
	pagesVar(fusec.Flags(), &fopt.Cache, "cache", "64MiB", "pd3 host cache")
	fusec.Flags().DurationVar(&fopt.Runtime, "runtime", 10*time.Second, "per job")
	fusec.Flags().IntVar(&fopt.Rounds, "rounds", 1, "run every system's jobs this many times, the systems taking turns in fresh processes, and report each one's median run (ratios of medians)")

	var gsize string
	gonbd := benchServer("gonbd-server", "go-nbd server", func(ctx context.Context, ln net.Listener) error {
		n, err := units.ParseSize(gsize)
		if err != nil {
			return err
		}
		return bench.ServeGoNBD(ctx, ln, n)
	})
	gonbd.Flags().StringVar(&gsize, "size", "1GiB", "export size")

	var region uint64
	var zeroCopy, answer bool
	raw := benchServer("raw-server", "raw server", func(ctx context.Context, ln net.Listener) error {
		return bench.ServeRaw(ctx, ln, region, zeroCopy, answer)
	})
	raw.Flags().Uint64Var(&region, "random-region", 0, "copy each block from a random page of a region this large")
	raw.Flags().BoolVar(&zeroCopy, "zero-copy", false, "with --random-region: write the blocks straight from the region's pages (writev), no copy of our own")
	raw.Flags().BoolVar(&answer, "answer", false, "with --random-region: answer 32-byte requests (the page's offset at byte 16) with a 16-byte header and the page, instead of streaming")

	var forward, busy string
	var proxy bool
	crossing := benchServer("crossing-server", "crossing server", func(ctx context.Context, ln net.Listener) error {
		return bench.ServeCrossing(ctx, ln, forward, busy, proxy)
	})
	crossing.PreRunE = func(*cobra.Command, []string) error {
		return bench.CheckCrossing(forward, busy, proxy)
	}
	crossing.Flags().StringVar(&forward, "forward", "", "relay each request to this address")
	crossing.Flags().BoolVar(&proxy, "proxy", false, "relay bytes to --forward in both directions (any protocol)")
	crossing.Flags().StringVar(&busy, "poll", "", "busy-poll instead of sleeping in poll(2): all (every input) or upstream (the forwarded request's answer)")
	var relayMount, relayTo string
	var relayConns int
	relay := &cobra.Command{
		Use: "fuse-relay", Hidden: true, Args: cobra.NoArgs,
		Short: "mount one file whose every READ and WRITE is one NBD request to --forward (bench fuse's go-fuse-nbdkit)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return bench.ServeFUSERelay(ctx, relayMount, relayTo, relayConns, func() {
				logger().Info("fuse relay mounted at " + relayMount)
			})
		},
	}
	relay.Flags().StringVar(&relayMount, "mount", "", "mount point")
	relay.Flags().StringVar(&relayTo, "forward", "", "NBD server address (host:port)")
	relay.Flags().IntVar(&relayConns, "conns", 8, "NBD connections (requests served at once)")
	relay.MarkFlagRequired("mount")
	relay.MarkFlagRequired("forward")
	ropt := bench.RepairOptions{Nodes: 3, Replicas: 2}
	repairc := &cobra.Command{
		Use:   "repair",
		Short: "A replicated volume losing a memory node: time until it is whole again, repair throughput, node memory per byte stored",
		Long: `A replicated volume losing one of its memory nodes: the time until the node
is seen down and until every extent has its replicas again, the repair's
throughput, and each node's RSS per byte stored. (pd3 bench nbd --systems
pd3-r1,pd3-r2 compares the data path at R=2 with R=1, pd3-r3,pd3-ec4+2
erasure coding with three copies.)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if ropt.Exe, err = exe(); err != nil {
				return err
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			rep, err := bench.Repair(ctx, ropt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	pagesVar(repairc.Flags(), &ropt.Size, "size", "1GiB", "volume size")
	pagesVar(repairc.Flags(), &ropt.Rate, "repair-rate", "1GiB", "the host's --repair-rate (bytes a second)")
	repairc.Flags().IntVar(&ropt.Nodes, "nodes", 3, "memory node processes")
	repairc.Flags().IntVar(&ropt.Replicas, "replicas", 2, "replicas of each extent")
	repairc.Flags().DurationVar(&ropt.Timeout, "timeout", 2*time.Minute, "give up on each wait after this long")
	sopt := bench.ScaleOptions{}
	var sweeps, volumeCounts, sizes, nodeCounts, hostCounts string
	scalec := &cobra.Command{
		Use:   "scale",
		Short: "How pd3's costs grow with its volumes' number and size, each configuration in fresh processes",
		Long: `How pd3's costs grow with its work. Each configuration runs in fresh processes on
loopback: pd3 coord, --nodes memory nodes and one pd3 serve --etcd that places
its volumes through the control plane. Reported per configuration: the time
from starting the host to its NBD server listening, creating the volumes and
reopening them; the host's RSS; the nodes' RSS per byte they store; the keys
in etcd, the requests etcd receives a second while the host is idle, and the
bytes of a volume's record.

--sweep volumes opens --volumes counts of 16 MiB volumes on one host; --sweep
size opens one volume of each of --sizes (sparse) and writes --written bytes
of it with fio, read back and checked. --sweep nodes runs fio randread Q32 and
randwrite Q32 with a FLUSH every 32 writes on one host at R=2 over each of
--node-counts nodes; --sweep hosts on each of --host-counts hosts at once over
--host-nodes nodes, every host with a volume of its own, beside as many
nbdkit memory servers (the ceiling in the same run). They report throughput,
p99, CPU per operation of the hosts and of the nodes, and etcd's requests a
second under the load.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if sopt.Exe, err = exe(); err != nil {
				return err
			}
			sopt.Sweeps = strings.Split(sweeps, ",")
			sopt.Sizes = nil
			counts := func(flag, list string) ([]int, error) {
				var ns []int
				for _, f := range strings.Split(list, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(f))
					if err != nil || n < 1 {
						return nil, fmt.Errorf("--%s %q: want counts separated by commas, e.g. 1,2,4", flag, list)
					}
					ns = append(ns, n)
				}
				return ns, nil
			}
			if sopt.Volumes, err = counts("volumes", volumeCounts); err != nil {
				return err
			}
			if sopt.NodeCounts, err = counts("node-counts", nodeCounts); err != nil {
				return err
			}
			if sopt.HostCounts, err = counts("host-counts", hostCounts); err != nil {
				return err
			}
			for _, f := range strings.Split(sizes, ",") {
				n, err := units.ParseSize(strings.TrimSpace(f))
				if err != nil {
					return fmt.Errorf("--sizes: %w", err)
				}
				sopt.Sizes = append(sopt.Sizes, n)
			}
			ctx, stop := sigctx(cmd)
			defer stop()
			if watched(asJSON) {
				sopt.Progress = &barProgress{}
			}
			rep, err := bench.Scale(ctx, sopt)
			if err != nil {
				return err
			}
			return emit(rep)
		},
	}
	scalec.Flags().StringVar(&sweeps, "sweep", strings.Join(bench.ScaleSweeps, ","), "dimensions to sweep: "+strings.Join(bench.ScaleSweeps, ", "))
	scalec.Flags().StringVar(&nodeCounts, "node-counts", "1,2,4,8", "memory node counts of the nodes sweep")
	scalec.Flags().StringVar(&hostCounts, "host-counts", "1,2,4", "host counts of the hosts sweep")
	scalec.Flags().IntVar(&sopt.HostNodes, "host-nodes", 4, "memory nodes under the hosts sweep")
	pagesVar(scalec.Flags(), &sopt.IOSize, "io-size", "512MiB", "each host's volume in the nodes and hosts sweeps (filled, then fio over all of it)")
	scalec.Flags().DurationVar(&sopt.Runtime, "runtime", 10*time.Second, "each fio job's measured time (nodes, hosts)")
	scalec.Flags().DurationVar(&sopt.Ramp, "ramp", time.Second, "each fio job's ramp before it measures (nodes, hosts)")
	scalec.Flags().StringArrayVar(&sopt.NodeArgs, "node-arg", nil, "an argument added to every memory node's command line (repeat), e.g. --node-arg=--poll-for=0")
	scalec.Flags().StringVar(&volumeCounts, "volumes", "1,64,1024", "volume counts of the volumes sweep")
	scalec.Flags().StringVar(&sizes, "sizes", "256MiB,1GiB,4GiB,16GiB", "volume sizes of the size sweep")
	pagesVar(scalec.Flags(), &sopt.Written, "written", "1GiB", "bytes written and read back in each volume of the size sweep (at most its size)")
	pagesVar(scalec.Flags(), &sopt.Cache, "cache", "64MiB", "the host's --cache")
	scalec.Flags().IntVar(&sopt.Nodes, "nodes", 2, "memory node processes")
	scalec.Flags().DurationVar(&sopt.Idle, "idle", 5*time.Second, "how long etcd's requests are counted with the host idle")
	scalec.Flags().IntVar(&sopt.Rounds, "rounds", 1, "run the nodes and hosts sweeps this many times, the configurations taking turns in fresh processes, and report each row's median run (ratios of medians)")
	cmd.AddCommand(transport, page, hv, lzc, nbdc, fusec, gonbd, raw, crossing, relay, repairc, scalec, appsCmd(exe, sigctx, emit, &asJSON))
	return cmd
}

// barProgress draws a benchmark's steps as a progress bar on stderr
// (schollz/progressbar, a maintained terminal progress bar). A step counts
// as done when the next one starts.
type barProgress struct {
	w       io.Writer // nil: stderr
	bar     *progressbar.ProgressBar
	running bool
}

func (p *barProgress) Begin(total int) {
	if p.w == nil {
		p.w = os.Stderr
	}
	p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(p.w), progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish(), progressbar.OptionSetPredictTime(false))
}

func (p *barProgress) Step(desc string) {
	if p.running {
		p.bar.Add(1)
	}
	p.bar.Describe(desc)
	p.running = true
}

func (p *barProgress) End() {
	if p.running {
		p.bar.Add(1)
	}
	p.bar.Finish()
}

// watched reports whether a person watches stderr (a terminal), so that
// progress is worth drawing; never with --json.
func watched(asJSON bool) bool { return !asJSON && term.IsTerminal(int(os.Stderr.Fd())) }

// benchServer is a hidden command that a benchmark starts as a peer: it
// listens on --listen, says so as role (what StartChild waits for) and
// serves until a signal.
func benchServer(use, role string, serve func(context.Context, net.Listener) error) *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use: use, Hidden: true, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := host.Listen(listen)
			if err != nil {
				return err
			}
			logger().Info(fmt.Sprintf("%s listening on %s", role, ln.Addr()))
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve(ctx, ln)
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "listen address")
	return c
}

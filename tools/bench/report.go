package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The results page, docs/BENCHMARKS.md: one section per frontend, each
// the run of one fixed `pd3 bench` command kept as JSON (docs/bench/) and
// rendered with its goals, met or not. `pd3 bench report --run all`
// regenerates every part; the page has no other source.

// Goal is a speed goal of an issue: Ratio (a key of Report.Ratios) at
// least Min, or at most Max when Max is set.
type Goal struct {
	Ratio string
	Min   float64
	Max   float64
	What  string // the goal in words
	// Ceiling marks no goal but the reference a goal is read against: the
	// same ratio for a design that does no work of its own, measured in the
	// same run (Min and Max unset).
	Ceiling bool
	// OrCeiling names the ceiling's ratio in the same run for a goal the
	// cores may not allow: where that ratio is below Min, the goal is to
	// reach it instead.
	OrCeiling string
}

// wanted is g's bound in rep: Max, or Min, or the ceiling's ratio where
// OrCeiling names one below Min. ceiling reports the last.
func wanted(g Goal, rep *Report) (bound float64, ceiling bool) {
	if g.Max > 0 {
		return g.Max, false
	}
	if c, ok := rep.Ratios[g.OrCeiling]; g.OrCeiling != "" && ok && c < g.Min {
		return c, true
	}
	return g.Min, false
}

// Suite is one section of the results page.
type Suite struct {
	Name  string   // file names: docs/bench/NAME.json, docs/img/bench-NAME.png
	Title string   // the section's heading
	Args  []string // pd3's arguments, without --json and --plot
	Unit  string   // what the table's numbers are
	// About says in a paragraph what the systems are and how the run is
	// made (markdown).
	About string
	Goals []Goal
	// Table renders the run's results; nil pivots them (renderTable): a
	// row per job or workload, a column per system.
	Table func(b *strings.Builder, rep *Report)
}

// Suites are the sections of the results page, in order.
func Suites() []Suite {
	return []Suite{
		{
			Name: "nbd", Title: "NBD: fio against pd3 and its peers",
			Args: []string{"bench", "nbd", "--systems", "pd3,pd3-local,nbdkit-memory,nbdkit-cache-nbd", "--rounds", "3", "--runtime", "5s", "--ramp", "1s"},
			Unit: "IOPS",
			About: "fio's nbd engine against each export of 1 GiB. `pd3`: host (64 MiB cache, embedded agent) and memory node, each its own process. " +
				"`pd3-local`: pd3's host with every page cached (the ceiling of its front end). `nbdkit-memory`: all data in one C server (the ceiling of any NBD server here). " +
				"`nbdkit-cache-nbd`: the fair remote peer, nbdkit's cache filter (64 MiB, cache-on-read) over its nbd plugin to a second `nbdkit memory`.",
			Goals: []Goal{
				{Ratio: "pd3/nbdkit-cache-nbd@randread-q1t1", Min: 1.5, What: "random reads at queue depth 1: 1.5× the cache chain"},
				{Ratio: "pd3/nbdkit-memory@randread-q1t1", Min: 0.5, What: "random reads at queue depth 1: half of nbdkit memory"},
				{Ratio: "pd3/nbdkit-cache-nbd@randread-q32t1", Min: 5, What: "random reads at queue depth 32: 5× the cache chain"},
				{Ratio: "pd3/nbdkit-memory@randread-q32t1", Min: 0.8, What: "random reads at queue depth 32: 0.8× nbdkit memory"},
				{Ratio: "pd3/nbdkit-memory@randread-q8t8", Min: 1.0, What: "8 threads × 8 random reads: nbdkit memory's rate"},
				{Ratio: "pd3/nbdkit-cache-nbd@randwrite-q32t1", Min: 1.0, What: "random writes at queue depth 32: the cache chain's rate"},
				{Ratio: "pd3-local/nbdkit-memory@randread-q1t1", Min: 1.0, What: "every page cached, queue depth 1: nbdkit memory's rate"},
			},
		},
		{
			Name: "fuse", Title: "FUSE: a file on the pd3 mount against its peers",
			Args: []string{"bench", "fuse", "--systems", "pd3,nbdfuse-cache-nbd,bindfs,tmpfs", "--rounds", "3", "--runtime", "5s"},
			Unit: "ops/s (1 MiB reads and writes: MiB/s; dbench: MB/s)",
			About: "fio on one 1 GiB file, the kernel's cache dropped before every job. `pd3`: `pd3 serve --mount`, 64 MiB host cache, agent and page-cache tracker, memory node in its own process. " +
				"`nbdfuse-cache-nbd`: nbdfuse over nbdkit's cache filter over its nbd plugin to `nbdkit memory` (the fair remote peer). " +
				"`bindfs`: bindfs over tmpfs (the ceiling of a FUSE filesystem). `tmpfs`: the kernel alone. " +
				"The pd3 mount sets the kernel's read-ahead of its device to 1 MiB, as far as one of its READs carries (docs/decisions.md, 34); the other FUSE mounts keep the kernel's 128 KiB, as their operators get them.",
			Goals: []Goal{
				{Ratio: "pd3/nbdfuse-cache-nbd@seqread1m-psync-1-direct", Min: 1.5, What: "1 MiB sequential direct reads: 1.5× the cache chain"},
				{Ratio: "pd3/bindfs@seqread1m-psync-1-direct", Min: 0.7, What: "1 MiB sequential direct reads: 0.7× bindfs"},
				{Ratio: "pd3/nbdfuse-cache-nbd@randread-psync-1-direct", Min: 2, What: "4 KiB random direct reads at depth 1: 2× the cache chain"},
				{Ratio: "pd3/bindfs@dbench-2", Min: 1.0, What: "dbench, 2 clients: bindfs's rate"},
			},
		},
		{
			Name: "page", Title: "Page server: random GETs over the page protocol",
			Args: []string{"bench", "page", "--systems", "local,relay-local,sync,pd3", "--rounds", "3", "--duration", "5s", "--warmup", "2s"},
			Unit: "GETs/s",
			About: "4 connections × 8 GETs in flight of uniformly random pages of 1 GiB, 64 MiB host cache, 16 MiB Loading Zone. " +
				"`local`: every page in the host. `relay-local`: a byte relay in front of `local` (the ceiling of any design whose data is elsewhere). " +
				"`sync`: a miss waits for the memory node. `pd3`: the embedded agent prefetches.",
			Goals: []Goal{
				{Ratio: "relay-local/local", Ceiling: true, What: "a relay doing no work of its own in front of all pages local"},
				{Ratio: "pd3/local", Min: 0.7, What: "0.7× all pages local"},
				{Ratio: "pd3/sync", Min: 1.65, What: "1.65× a host without prefetching"},
				{Ratio: "cpu:pd3/local", Max: 1.25, What: "host CPU per GET at most 1.25× local's"},
			},
		},
		{
			Name: "cluster", Title: "Cluster: replicated volumes (R=2 against R=1)",
			Args:  []string{"bench", "nbd", "--systems", "pd3-r1,pd3-r2", "--jobs", "randwrite-q32-flush32,randread-q32t1,randread-q1t1", "--rounds", "3", "--runtime", "5s", "--ramp", "1s"},
			Unit:  "IOPS",
			About: "fio's nbd engine against a 1 GiB volume striped in 16 MiB extents over two `pd3 memnode` processes with a `pd3 coord`, with `--replicas 1` and `2`; 64 MiB host cache.",
			Goals: []Goal{
				{Ratio: "pd3-r2/pd3-r1@randwrite-q32-flush32", Min: 0.7, What: "random writes at depth 32 with a FLUSH every 32: 0.7× one replica"},
				{Ratio: "pd3-r2/pd3-r1@randread-q32t1", Min: 0.95, What: "random reads at depth 32: 0.95× one replica"},
				{Ratio: "pd3-r2/pd3-r1@randread-q1t1", Min: 0.95, What: "random reads at depth 1: 0.95× one replica"},
			},
		},
		{
			Name: "ec", Title: "Cluster: erasure-coded volumes (EC 4+2 against R=3)",
			Args:  []string{"bench", "nbd", "--systems", "pd3-r3,pd3-r3-n6,pd3-ec4+2,pd3-ec4+2-down1", "--jobs", "randwrite-q32-flush32,randread-q32t1,randread-q1t1", "--rounds", "3", "--runtime", "5s", "--ramp", "1s"},
			Unit:  "IOPS",
			About: "fio's nbd engine against a 1 GiB volume over `pd3 memnode` processes with a `pd3 coord`: `--replicas 3` over three nodes and over six (`pd3-r3-n6`; survives two lost nodes for 3× the memory) and `--ec 4+2` over six (survives two for 1.5×); `pd3-ec4+2-down1` is the same with one node killed after the fill (reads of its pages decode from four others; nowhere to repair to). 64 MiB host cache. memory/stored is the nodes' page memory per byte of the volume, after the fill.",
			Goals: []Goal{
				{Ratio: "memory/stored:pd3-ec4+2", Max: 1.55, What: "memory at the nodes per byte stored: at most 1.55 (R=3: 3.0)"},
				{Ratio: "pd3-ec4+2/pd3-r3@randread-q1t1", Min: 0.95, What: "random reads at depth 1: 0.95× three replicas"},
				{Ratio: "pd3-ec4+2/pd3-r3@randread-q32t1", Min: 0.95, What: "random reads at depth 32: 0.95× three replicas"},
				{Ratio: "pd3-ec4+2/pd3-r3@randwrite-q32-flush32", Min: 0.7, What: "random writes at depth 32 with a FLUSH every 32: 0.7× three replicas"},
				{Ratio: "pd3-ec4+2/pd3-r3-n6@randread-q32t1", Min: 0.95, What: "random reads at depth 32: 0.95× three replicas over the same six nodes"},
				{Ratio: "pd3-ec4+2/pd3-r3-n6@randwrite-q32-flush32", Min: 0.7, What: "random writes at depth 32 with a FLUSH every 32: 0.7× three replicas over the same six nodes"},
				{Ratio: "pd3-ec4+2-down1/pd3-ec4+2@randread-q32t1", Min: 0.5, What: "random reads at depth 32 with a node down: half the healthy rate"},
			},
		},
		{
			Name: "apps", Title: "Applications under memory pressure: PostgreSQL and fio over NBD",
			Args: []string{"bench", "apps", "--systems", "local,nbdkit-memory,relay,pd3-noagent,pd3-leap,pd3,pd3-oracle,pd3-cached", "--workloads", "pg-scan,pg-select,pg-tpcb,fio-zipf,fio-seq4", "--rounds", "3", "--duration", "10s"},
			Unit: "transactions or reads a second; the scan in ms",
			About: "ext4 on a loop device over nbdfuse over each NBD export; the application (PostgreSQL 15 with pgbench scale 20, about 320 MB; fio on a 512 MiB file) and the page cache it fills held to 96 MiB by a memory cgroup; the servers outside it. " +
				"`nbdkit-memory` is the ceiling (data in the server's RAM); `relay` is nbdkit's nbd plugin to a second `nbdkit memory`, no cache: the plain remote peer. " +
				"`pd3-noagent`, `pd3-leap` and `pd3`: host (64 MiB cache) and memory node, without a prefetcher, with Leap, with the embedded agent (which has the host read predicted streams ahead into windows of its own, which the stream's reads of every size take their pages from, docs/decisions.md 33 and 41). " +
				"`pd3-oracle`: a prefetcher that never lets a read wait, measured: the host with a cache as large as the export and no agent, whose every read also fetches its pages from the memory node, unwaited, and drops them (`--shadow-reads`, docs/decisions.md 43): every transfer paid, none waited for. A host whose 64 MiB cache holds some pages fetches fewer, so pd3 can come out above it; where the transfers are what limits the run (the streams), nothing can. " +
				"`pd3-cached`: the same host without the transfers: what pd3's own serving costs. " +
				"nbdkit's cache filter is no peer here: with `cache-max-size` it corrupts PostgreSQL's data (`invalid page in block`, amcheck fails).",
			Goals: []Goal{
				{Ratio: "relay/nbdkit-memory@pg-scan@96MiB", Ceiling: true, What: "one more hop and no cache (the relay) against all data in the server, scan"},
				{Ratio: "relay/nbdkit-memory@pg-tpcb@96MiB", Ceiling: true, What: "the same, TPC-B"},
				{Ratio: "relay/nbdkit-memory@pg-select@96MiB", Ceiling: true, What: "the same, select-only"},
				{Ratio: "pd3-cached/relay@pg-scan@96MiB", Ceiling: true, What: "pd3 with every page in the host against the relay, scan"},
				{Ratio: "pd3-cached/relay@pg-tpcb@96MiB", Ceiling: true, What: "the same, TPC-B"},
				{Ratio: "pd3-cached/relay@pg-select@96MiB", Ceiling: true, What: "the same, select-only"},
				{Ratio: "pd3-oracle/pd3-noagent@pg-scan@96MiB", Ceiling: true, What: "no read waiting, every page fetched (the oracle), against agent-off, scan"},
				{Ratio: "pd3-oracle/pd3-noagent@fio-seq4@96MiB", Ceiling: true, What: "the same, sequential streams"},
				{Ratio: "pd3/nbdkit-memory@pg-scan@96MiB", Min: 1.0, What: "PostgreSQL scan: the ceiling's time"},
				{Ratio: "pd3/nbdkit-memory@pg-tpcb@96MiB", Min: 1.0, What: "TPC-B: the ceiling's rate"},
				{Ratio: "pd3/nbdkit-memory@pg-select@96MiB", Min: 0.9, What: "select-only: 0.9× the ceiling"},
				{Ratio: "pd3/relay@pg-scan@96MiB", Min: 1.3, What: "PostgreSQL scan: 1.3× the relay"},
				{Ratio: "pd3/relay@pg-tpcb@96MiB", Min: 1.3, What: "TPC-B: 1.3× the relay"},
				{Ratio: "pd3/relay@pg-select@96MiB", Min: 1.3, What: "select-only: 1.3× the relay"},
				{Ratio: "pd3/relay@fio-zipf@96MiB", Min: 1.0, What: "fio Zipf reads: the relay's rate"},
				{Ratio: "pd3/relay@fio-seq4@96MiB", Min: 1.0, What: "fio 4 sequential streams: the relay's rate"},
				{Ratio: "pd3/pd3-noagent@pg-scan@96MiB", Min: 1.3, What: "the agent on a scan: 1.3× agent-off"},
				{Ratio: "pd3/pd3-noagent@fio-seq4@96MiB", Min: 1.3, What: "the agent on sequential streams: 1.3× agent-off"},
				{Ratio: "pd3/pd3-noagent@pg-select@96MiB", Min: 1.0, What: "the agent on select-only: agent-off's rate"},
				{Ratio: "pd3/pd3-noagent@pg-tpcb@96MiB", Min: 1.0, What: "the agent on TPC-B: agent-off's rate"},
				{Ratio: "pd3/pd3-noagent@fio-zipf@96MiB", Min: 1.0, What: "the agent on Zipf reads: agent-off's rate"},
			},
		},
		{
			Name: "apps-budgets", Title: "Applications under memory pressure: PostgreSQL at a quarter, half and all of its data",
			Args: []string{"bench", "apps", "--systems", "nbdkit-memory,relay,pd3-noagent,pd3", "--workloads", "pg-scan,pg-select,pg-tpcb", "--local-memory", "80MiB,160MiB,320MiB", "--rounds", "3", "--duration", "10s"},
			Unit: "transactions a second; the scan in ms",
			About: "The section above at three budgets instead of one: PostgreSQL 15 with pgbench scale 20 (about 320 MB) on ext4 on a loop device over nbdfuse over each NBD export, its processes and page cache held to 80 MiB, 160 MiB and 320 MiB (a quarter, half and all of the database) by a memory cgroup, the servers outside it, as the field shows remote memory (Infiniswap, Leap, PD3's Figure 18: the share of the working set in local memory). " +
				"`nbdkit-memory` under the same budget is the ceiling, `relay` the plain remote peer, `pd3-noagent` and `pd3` the host (64 MiB cache) and memory node without and with the embedded agent.",
			Goals: []Goal{
				{Ratio: "pd3/relay@pg-scan@80MiB", Min: 1.0, What: "a quarter of the data local, scan: the relay's time"},
				{Ratio: "pd3/relay@pg-select@80MiB", Min: 1.0, What: "the same, select-only: the relay's rate"},
				{Ratio: "pd3/relay@pg-tpcb@80MiB", Min: 1.0, What: "the same, TPC-B"},
				{Ratio: "pd3/relay@pg-scan@160MiB", Min: 1.0, What: "half the data local, scan: the relay's time"},
				{Ratio: "pd3/relay@pg-select@160MiB", Min: 1.0, What: "the same, select-only: the relay's rate"},
				{Ratio: "pd3/relay@pg-tpcb@160MiB", Min: 1.0, What: "the same, TPC-B"},
			},
		},
		{
			Name: "apps-fuse", Title: "Applications under memory pressure: files on the mount",
			Args: []string{"bench", "apps", "--systems", "bindfs,pd3-mount-noagent,pd3-mount,pd3-mount-oracle,pd3-mount-cached", "--workloads", "sqlite-point,sqlite-scan,tree-tar,tree-grep", "--rounds", "3", "--duration", "10s"},
			Unit: "lookups or rows or files a second; the scans and trees in ms",
			About: "A sqlite table of 300 000 rows of 1 KiB and a tree of 20 000 files of 1–16 KiB, written with no budget; then read by processes held to 96 MiB. " +
				"`bindfs` is bindfs over tmpfs under the same budget (the ceiling of a FUSE filesystem); `pd3-mount` the pd3 mount (64 MiB host cache, memory node in its own process), `pd3-mount-noagent` the same with `--dpu none`, `pd3-mount-oracle` a prefetcher that never lets a read wait, measured: the mount with a host cache larger than the data and no agent, whose every read also fetches its pages from the memory node, unwaited, and drops them (every transfer paid, none waited for, docs/decisions.md 43); `pd3-mount-cached` the same without the transfers (the ceiling of pd3's own serving). " +
				"The pd3 mount sets the kernel's read-ahead of its device to 1 MiB (docs/decisions.md, 34); bindfs keeps the kernel's 128 KiB (at 1 MiB its scan took 430–500 ms against 552–698 ms, decision 34). " +
				"With the agent, the kernel page-cache tracker follows the page cache for Host View, of files of 1 MiB or more only (the tree's are not followed, docs/decisions.md 44), and not of a file while the mount reads it ahead (36 and 37). The lookups leave pages of the table in the kernel's cache, so the scan after them is sent READs of the runs between those pages; the mount reads such a scan ahead through the page store's windows, with or without the agent: that is the prefetching counted for pd3-mount-noagent below (docs/decisions.md, 38).",
			Goals: []Goal{
				{Ratio: "pd3-mount/bindfs@sqlite-point@96MiB", Min: 0.9, What: "sqlite point lookups: 0.9× bindfs"},
				{Ratio: "pd3-mount/bindfs@sqlite-scan@96MiB", Min: 0.8, What: "sqlite scan: 0.8× bindfs"},
				{Ratio: "pd3-mount/pd3-mount-noagent@sqlite-scan@96MiB", Min: 1.3, What: "the agent on a scan: 1.3× agent-off"},
				{Ratio: "pd3-mount/pd3-mount-noagent@sqlite-point@96MiB", Min: 1.0, What: "the agent on point lookups: agent-off's rate"},
				{Ratio: "pd3-mount/pd3-mount-noagent@tree-tar@96MiB", Min: 1.0, What: "the agent on a tree of 20 000 small files, tar: agent-off's time"},
				{Ratio: "pd3-mount/pd3-mount-noagent@tree-grep@96MiB", Min: 1.0, What: "the same, grep -r"},
				{Ratio: "pd3-mount-oracle/bindfs@sqlite-scan@96MiB", Ceiling: true, What: "no read waiting, every page fetched (the oracle), on the mount against bindfs, scan"},
				{Ratio: "pd3-mount-oracle/pd3-mount-noagent@sqlite-scan@96MiB", Ceiling: true, What: "the same against agent-off, scan"},
				{Ratio: "pd3-mount-cached/bindfs@sqlite-point@96MiB", Ceiling: true, What: "the mount with every page in the host against bindfs, point lookups"},
				{Ratio: "pd3-mount-cached/bindfs@sqlite-scan@96MiB", Ceiling: true, What: "the same, scan"},
			},
		},
		{
			Name: "scale", Title: "Scale: memory nodes, hosts, volume sizes and volume counts",
			Args: []string{"bench", "scale", "--rounds", "3"},
			About: "Every configuration in fresh processes on loopback: `pd3 coord`, the memory nodes and the hosts (`pd3 serve --etcd`, no `--memnode`: the control plane places the volumes), 64 MiB host cache, no agent. " +
				"The nodes sweep runs one host at R=2 over 1, 2, 4 and 8 nodes (R=1 over one); the hosts sweep 1, 2 and 4 hosts at once over 4 nodes, each with a 512 MiB volume of its own, beside as many `nbdkit memory` servers (the ceiling of any NBD server on these cores). " +
				"The size sweep opens one sparse volume of 256 MiB to 16 GiB and writes 1 GiB of it (all of a smaller one) with fio, read back and checked; the volumes sweep opens 1, 64 and 1 024 volumes of 16 MiB on one host. " +
				"Two cores shared by up to thirteen processes give four hosts no more reads in all than one: the `nbdkit memory` rows measure how many fewer in the same run, and pd3's four hosts are held to that ceiling, not to 3×. pd3's processes run in SCHED_BATCH, so a request one hands another does not preempt the sender and requests and answers leave together with several hosts as with one (docs/decisions.md, 47); a node serving several hosts waits for their requests in the network poller and does not poll (32 and 45). A host sends each node the requests of a burst (the NBD requests it read at once, a write-back batch) in one write (48): more nodes still cost it more system calls per operation, as the fewer requests per node leave and answer in smaller batches (30).",
			Table: renderScale,
			Goals: []Goal{
				{Ratio: "host_cpu_per_op:nodes=8/nodes=1@randread-q32t1", Max: 1.15, What: "host CPU per random read, 8 nodes against 1"},
				{Ratio: "host_cpu_per_op:nodes=8/nodes=1@randwrite-q32-flush32", Max: 1.15, What: "host CPU per random write with FLUSH, 8 nodes against 1"},
				{Ratio: "aggregate:nbdkit-memory hosts=4/hosts=1@randread-q32t1", Ceiling: true, What: "4 nbdkit memory servers against 1 on the same cores"},
				{Ratio: "aggregate:pd3 hosts=4/hosts=1@randread-q32t1", Min: 3, OrCeiling: "aggregate:nbdkit-memory hosts=4/hosts=1@randread-q32t1", What: "random reads of 4 hosts against 1 (or the ceiling above, where the cores cannot give 3×)"},
				{Ratio: "host_rss:size=16GiB/size=256MiB", Max: 1.1, What: "host RSS with a 16 GiB volume against 256 MiB (1 GiB written against 256 MiB)"},
				{Ratio: "host_rss:size=16GiB/size=1GiB", Max: 1.1, What: "host RSS with a 16 GiB volume against 1 GiB, 1 GiB written to each"},
				{Ratio: "memnode_rss/stored:size=16GiB", Max: 1.05, What: "node RSS per byte stored, 16 GiB volume"},
				{Ratio: "memnode_rss/stored:size=256MiB", Max: 1.05, What: "node RSS per byte stored, 256 MiB volume"},
				{Ratio: "memnode_rss_added/stored_added:size=16GiB/size=256MiB", Max: 1.05, What: "node RSS added per byte stored added, 256 MiB to 16 GiB (without the processes' fixed cost)"},
				{Ratio: "etcd_rps:volumes=1024/volumes=1", Max: 1.5, What: "etcd requests a second of an idle host, 1 024 volumes against 1"},
				{Ratio: "open_s:volumes=1024", Max: 5, What: "seconds to reopen 1 024 volumes"},
			},
		},
	}
}

// SuiteRun is one suite's run as docs/bench/NAME.json keeps it.
type SuiteRun struct {
	Suite   string    `json:"suite"`
	Command string    `json:"command"`
	Commit  string    `json:"commit,omitempty"`
	Date    time.Time `json:"date"`
	Seconds float64   `json:"seconds"`
	Report  *Report   `json:"report,omitempty"`
	Err     string    `json:"error,omitempty"`
}

// suiteStopWait is how long a cancelled suite has to clean up before it
// is killed: a pd3 host flushing to a memory node that is gone retries
// for its operation timeout (30 s) first.
const suiteStopWait = 2 * time.Minute

// RunSuite runs s with the pd3 binary exe, drawing its chart to img; its
// progress goes to progress.
func RunSuite(ctx context.Context, exe string, s Suite, img string, progress io.Writer) SuiteRun {
	args := append(slices.Clone(s.Args), "--json", "--plot", img)
	run := SuiteRun{Suite: s.Name, Command: "pd3 " + strings.Join(s.Args, " "), Date: time.Now().UTC(), Commit: gitCommit()}
	start := time.Now()
	cmd := exec.CommandContext(ctx, exe, args...)
	// Stopped, the benchmark is asked to stop (SIGTERM), so that it
	// unmounts, detaches its loop devices and removes its cgroups; killed
	// only if it has not done so in time.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = suiteStopWait
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, progress
	err := cmd.Run()
	run.Seconds = time.Since(start).Seconds()
	if err != nil {
		run.Err = err.Error()
		return run
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		run.Err = fmt.Sprintf("reading its report: %v", err)
		return run
	}
	run.Report = &rep
	return run
}

// gitCommit is the commit the running binary was built from, with "+"
// if its tree had changes (Go's build information); "" if it was built
// outside a repository.
func gitCommit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if rev != "" && modified == "true" {
		rev += "+"
	}
	return rev
}

// RenderReport writes the results page from the runs found, in the
// suites' order; a suite never run is said to be missing.
func RenderReport(w io.Writer, runs map[string]SuiteRun) error {
	var b strings.Builder
	var secs float64
	for _, r := range runs {
		secs += r.Seconds
	}
	fmt.Fprintf(&b, `# pd3 benchmarks: current results

Every number here comes from one command, which runs each section's
benchmark and rewrites this page (root; %.0f minutes on the 2-core machine
at the last runs):

`, secs/60)
	b.WriteString("```sh\nmake bench-report        # pd3 bench report --run all\n```" + `

Each section is one ` + "`pd3 bench`" + ` run: the systems compared take turns in
fresh processes, round by round, and each cell is the median of three runs
with their range. On these shared 2-core VMs one run swings by a fifth or
more, so compare ratios within a section, and read a goal whose ratio lies
within the runs' spread as neither met nor missed. What was tried and
dropped is in [decisions.md](decisions.md); the measurements behind earlier
changes are in the commit messages. pd3's serving processes run in the
kernel's SCHED_BATCH class, as they ship since 0a8b186 (sections run at an
earlier commit had them in the default class; docs/decisions.md, 47); the
clients and the peers run in the default class.

`)
	for _, s := range Suites() {
		run, ok := runs[s.Name]
		fmt.Fprintf(&b, "## %s\n\n", s.Title)
		if !ok {
			fmt.Fprintf(&b, "Not run yet: `pd3 bench report --run %s`.\n\n", s.Name)
			continue
		}
		renderSuite(&b, s, run)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func renderSuite(b *strings.Builder, s Suite, run SuiteRun) {
	fmt.Fprintf(b, "```sh\n%s\n```\n\n", wrapCommand(run.Command))
	machine := "?"
	if run.Report != nil {
		machine = run.Report.Machine
	}
	fmt.Fprintf(b, "**Run** %s at %s on %s, %.0f minutes.\n\n", run.Date.Format("2006-01-02"), cmp.Or(run.Commit, "an unknown commit"), machine, run.Seconds/60)
	fmt.Fprintf(b, "%s\n\n", s.About)
	if run.Err != "" {
		fmt.Fprintf(b, "**The run failed:** `%s`. Its results are missing until it runs through.\n\n", run.Err)
		return
	}
	rep := run.Report
	if s.Table != nil {
		s.Table(b, rep)
	} else {
		renderTable(b, rep, s.Unit)
	}
	renderChecks(b, rep)
	fmt.Fprintf(b, "![%s](img/bench-%s.png)\n\n", s.Title, s.Name)
	renderGoals(b, rep, s.Goals)
}

// renderTable pivots rep: a row per job or workload, a column per system,
// each cell the median run with the range of all runs.
func renderTable(b *strings.Builder, rep *Report, unit string) {
	var systems, configs []string
	cells := map[[2]string]Result{}
	for _, r := range rep.Results {
		if !slices.Contains(systems, r.System) {
			systems = append(systems, r.System)
		}
		if !slices.Contains(configs, r.Config) {
			configs = append(configs, r.Config)
		}
		cells[[2]string{r.System, r.Config}] = r
	}
	fmt.Fprintf(b, "%s:\n\n| | %s |\n|---|%s\n", unit, strings.Join(systems, " | "), strings.Repeat("---|", len(systems)))
	for _, c := range configs {
		fmt.Fprintf(b, "| %s |", cmp.Or(c, "all"))
		for _, sys := range systems {
			r, ok := cells[[2]string{sys, c}]
			if !ok {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(b, " %s |", cell(r))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// renderChecks says whether the data survived every run, where the
// benchmark checked it, and how the prefetchers did: accuracy (prefetched
// pages the host took) and coverage (host misses the Loading Zone or the
// read-ahead windows served).
func renderChecks(b *strings.Builder, rep *Report) {
	var checked int
	var failed []string
	prefetch := map[string][]string{}
	var prefetchers []string
	for _, r := range rep.Results {
		if r.Integrity != "" {
			checked++
			if r.Integrity != "ok" {
				failed = append(failed, fmt.Sprintf("%s %s: %s", r.System, r.Config, r.Integrity))
			}
		}
		if acc := r.PrefetchAccuracy(); acc > 0 {
			if _, ok := prefetch[r.System]; !ok {
				prefetchers = append(prefetchers, r.System)
			}
			prefetch[r.System] = append(prefetch[r.System], fmt.Sprintf("%s %.0f / %.0f %%", r.Config, 100*acc, 100*r.LZHitRatio()))
		}
	}
	if checked > 0 {
		if len(failed) == 0 {
			b.WriteString("**Data** checked after every run of every system (PostgreSQL's `pg_amcheck --heapallindexed`, sqlite's `integrity_check`, `e2fsck -fn`): intact.\n\n")
		} else {
			fmt.Fprintf(b, "**Data checks failed:** %s.\n\n", strings.Join(failed, "; "))
		}
	}
	for _, sys := range prefetchers {
		fmt.Fprintf(b, "**Prefetching** by `%s`, accuracy / coverage: %s.\n\n", sys, strings.Join(prefetch[sys], ", "))
	}
}

// renderScale is the scale suite's table: the I/O sweeps (nodes, hosts)
// and the opening sweeps (volume sizes and counts) in a table each, then
// how the run was made.
func renderScale(b *strings.Builder, rep *Report) {
	dash := func(v float64, prec int) string {
		if v == 0 {
			return "–"
		}
		if prec == 0 {
			return group(v)
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	mb := func(n uint64) string { return dash(mib(n), 0) }
	var io, open strings.Builder
	for _, r := range rep.Results {
		switch {
		case r.OpsPerSec > 0:
			fmt.Fprintf(&io, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Config, r.System, cell(r), dash(r.P99us, 0),
				dash(r.HostCPUusOp, 1), dash(r.MemnodeCPUusOp, 1), dash(r.EtcdReqPerSec, 1))
		case r.CreateMillis > 0:
			perByte := "–"
			if v, ok := rssPerStored(r); ok {
				perByte = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(&open, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Config, dash(r.CreateMillis, 0), dash(r.OpenMillis, 0),
				mb(r.HostRSS), mb(r.MemnodeStored), perByte, dash(float64(r.EtcdKeys), 0), dash(r.EtcdReqPerSec, 1), dash(float64(r.MapBytes), 0))
		}
	}
	if io.Len() > 0 {
		fmt.Fprintf(b, "Under load (the hosts' sum; CPU per operation of all hosts, of all nodes):\n\n| | system | ops/s | p99 µs | host CPU µs/op | node CPU µs/op | etcd req/s |\n|---|---|---|---|---|---|---|\n%s\n", io.String())
	}
	if open.Len() > 0 {
		fmt.Fprintf(b, "Opening (create: the first start of the host, reopen: the second; etcd req/s with the host idle):\n\n| | create ms | reopen ms | host RSS MiB | stored MiB | node RSS / stored | etcd keys | etcd req/s | record bytes |\n|---|---|---|---|---|---|---|---|---|\n%s\n", open.String())
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(b, "%s.\n\n", strings.TrimSuffix(upperFirst(n), "."))
	}
}

// upperFirst capitalises s's first letter.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// cell is a result's median with its runs' range: a time where the row
// timed one operation, else a rate.
func cell(r Result) string {
	lo, hi := r.OpsPerSec, r.OpsPerSec
	if n := len(r.RoundsOpsPerSec); n > 1 {
		lo, hi = r.RoundsOpsPerSec[0], r.RoundsOpsPerSec[n-1]
	}
	if r.Millis > 0 && r.OpsPerSec > 0 {
		// A rate r.OpsPerSec took r.Millis: the other runs' times scale
		// inversely.
		ms := func(rate float64) string { return group(r.Millis * r.OpsPerSec / rate) }
		if lo == hi {
			return ms(r.OpsPerSec) + " ms"
		}
		return fmt.Sprintf("%s ms (%s–%s)", ms(r.OpsPerSec), ms(hi), ms(lo))
	}
	if lo == hi {
		return group(r.OpsPerSec)
	}
	return fmt.Sprintf("%s (%s–%s)", group(r.OpsPerSec), group(lo), group(hi))
}

// renderGoals lists each goal with its ratio in this run: met, not met, or
// within the runs' spread.
func renderGoals(b *strings.Builder, rep *Report, goals []Goal) {
	if len(goals) == 0 {
		return
	}
	missed := 0
	var rows strings.Builder
	goalsN := 0
	for _, g := range goals {
		v, ok := rep.Ratios[g.Ratio]
		if g.Ceiling {
			value := "–"
			if ok {
				value = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(&rows, "| %s | `%s` | | %s | the ceiling here |\n", g.What, g.Ratio, value)
			continue
		}
		goalsN++
		w, atCeiling := wanted(g, rep)
		verdict := "not measured"
		if ok {
			met := v >= w
			if g.Max > 0 {
				met = v <= w
			}
			verdict = "met"
			if !met {
				verdict = "**not met**"
				missed++
			}
			if sp := ratioSpread(rep, g.Ratio); sp > 0 && v > 0 && math.Abs(w/v-1) < sp {
				verdict += fmt.Sprintf(" (within the runs' spread, ±%.0f %%)", 100*sp)
			}
		}
		value := "–"
		if ok {
			value = fmt.Sprintf("%.2f", v)
		}
		bound := fmt.Sprintf("≥ %.2f", w)
		switch {
		case g.Max > 0:
			bound = fmt.Sprintf("≤ %.2f", w)
		case atCeiling:
			bound = fmt.Sprintf("≥ %.2f, the ceiling (%.2f asked)", w, g.Min)
		}
		fmt.Fprintf(&rows, "| %s | `%s` | %s | %s | %s |\n", g.What, g.Ratio, bound, value, verdict)
	}
	fmt.Fprintf(b, "Goals: %d of %d not met in this run.\n\n| goal | ratio | wanted | this run | |\n|---|---|---|---|---|\n%s\n", missed, goalsN, rows.String())
}

// ratioSpread is how far, relative to itself, a ratio A/B@CONFIG of rates
// could move within its two rows' runs; 0 when unknown.
func ratioSpread(rep *Report, key string) float64 {
	sp, _ := spreadOf(rep, key)
	return sp
}

// spreadOf is how far, relative to itself, a ratio A/B@CONFIG of rates
// could move within its two rows' runs: the sum of their ranges over
// their medians. ok is false for a ratio that is not of two rows' rates
// (CPU or memory, "KIND:…"); a spread of 0 with ok means a single run.
func spreadOf(rep *Report, key string) (spread float64, ok bool) {
	if strings.Contains(key, ":") {
		return 0, false
	}
	pair, config, _ := strings.Cut(key, "@")
	a, b, cut := strings.Cut(pair, "/")
	if !cut {
		return 0, false
	}
	row := func(sys string) (float64, bool) {
		for _, r := range rep.Results {
			if r.System == sys && (config == "" || r.Config == config) {
				if n := len(r.RoundsOpsPerSec); n > 1 && r.OpsPerSec > 0 {
					return (r.RoundsOpsPerSec[n-1] - r.RoundsOpsPerSec[0]) / r.OpsPerSec, true
				}
				return 0, true
			}
		}
		return 0, false
	}
	sa, oka := row(a)
	sb, okb := row(b)
	if !oka || !okb {
		return 0, false
	}
	if sa == 0 || sb == 0 {
		return 0, true // a single run on either side: no spread known
	}
	return sa + sb, true
}

// group prints a number with a space between thousands, two decimals
// below 10.
func group(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}

// wrapCommand breaks a long command line before its flags, shell-style.
func wrapCommand(c string) string {
	var lines []string
	line := ""
	for _, f := range strings.Fields(c) {
		if len(line)+len(f) > 76 && strings.HasPrefix(f, "--") {
			lines = append(lines, line+" \\")
			line = "  "
		} else if line != "" && line != "  " {
			line += " "
		}
		line += f
	}
	return strings.Join(append(lines, line), "\n")
}

// LoadRuns reads the runs kept in dir (NAME.json each).
func LoadRuns(dir string) (map[string]SuiteRun, error) {
	runs := map[string]SuiteRun{}
	for _, s := range Suites() {
		b, err := os.ReadFile(dir + "/" + s.Name + ".json")
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var r SuiteRun
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s/%s.json: %w", dir, s.Name, err)
		}
		runs[s.Name] = r
	}
	return runs, nil
}

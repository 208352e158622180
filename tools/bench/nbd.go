package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/loopport"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/tools/fio"
	"github.com/pojntfx/go-nbd/pkg/backend"
	"github.com/pojntfx/go-nbd/pkg/server"
)

// NBDOptions configure the NBD benchmark.
type NBDOptions struct {
	Exe     string
	Systems []string // pd3, nbdkit-memory, go-nbd
	Jobs    []string // fio job names under tools/fio
	Size    uint64
	Cache   uint64
	Runtime time.Duration
	Ramp    time.Duration
	// Rounds runs the whole suite this many times, the systems taking
	// turns, and reports each system's median run of each job.
	Rounds int
	// Progress, if set, is told each system's fill and jobs.
	Progress Progress
}

// NBDSystems lists the servers NBD compares; pd3-persist is pd3 with a
// persistent memory node (--persist), for the cost of durability;
// pd3-local is pd3's host with every page in its cache and no memory
// node (--local): the ceiling of any remote configuration; pd3-local-poll
// is the same polling for the next request after each hit
// (--nbd-poll-for 50µs), for what that buys at queue depth 1 and costs
// deeper.
// nbdkit-cache-nbd is the fair remote peer: nbdkit's cache filter (the
// same cache size as pd3's, in RAM) over its nbd plugin to a second
// nbdkit holding the data in memory, a process of its own like pd3's
// memory node; nbdkit-readahead-cache-nbd adds nbdkit's readahead filter
// above the cache (prefetching).
//
// pd3-rN are replicated volumes (--replicas N) over max(2, N) memory
// node processes and a pd3 coord, with the embedded agent as pd3: the
// cost of each replica; pd3-ecK+M an erasure-coded one (--ec K+M) over
// K+M nodes (clusterSystem has the suffixes). Their memory nodes are
// measured together (CPU, RSS and stored bytes summed).
//
// go-relay-nbdkit-memory is the ceiling of a miss as pd3's host makes it:
// a Go process that only relays bytes (each direction on a goroutine
// sleeping in poll(2), as pd3's host reads) in front of nbdkit memory in
// a process of its own, so every read makes a miss's four crossings and
// nothing else. A relay whose sending thread reads each answer itself is
// faster still (pd3 bench nbd --breakdown, the go-relay rows).
var NBDSystems = []string{"pd3", "nbdkit-memory", "nbdkit-cache-nbd", "nbdkit-readahead-cache-nbd", "go-nbd", "pd3-persist", "pd3-local", "pd3-local-poll", "pd3-r1", "pd3-r2", "pd3-r3", "pd3-ec4+2", "pd3-ec4+2-down1", "pd3-r1-noagent", "pd3-r2-noagent", "go-relay-nbdkit-memory"}

// NBDJobs are the default fio jobs.
var NBDJobs = []string{"randread-q1t1", "randread-q1t4", "randread-q32t1", "randread-q8t8", "randwrite-q32t1"}

// NBD runs fio's nbd engine against each server with the same jobs, after
// filling the export once, and reports IOPS with ratios.
func NBD(ctx context.Context, opt NBDOptions) (*Report, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, fmt.Errorf("fio is not installed (make deps-system)")
	}
	dir, err := os.MkdirTemp("", "pd3-fio-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	files, _ := fio.Jobs.ReadDir(".")
	for _, f := range files {
		b, _ := fio.Jobs.ReadFile(f.Name())
		if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o644); err != nil {
			return nil, err
		}
	}
	rep := &Report{Bench: "nbd", Machine: Machine(), Ratios: map[string]float64{}}
	iops, err := runSuite(rep, opt.Progress, opt.Rounds, opt.Systems, opt.Jobs, func(sys string) (suiteSystem, error) {
		uri, server, nodes, stop, err := startNBDSystem(ctx, opt, sys)
		if err != nil {
			return suiteSystem{}, err
		}
		env := []string{"NBD_URI=" + uri, "SIZE=" + strconv.FormatUint(opt.Size, 10),
			"RUNTIME=" + strconv.Itoa(int(opt.Runtime.Seconds())), "RAMP=" + strconv.Itoa(int(opt.Ramp.Seconds()))}
		return suiteSystem{
			proc: server, nodes: nodes, stop: stop,
			fill: func() error {
				if _, err := runFio(ctx, filepath.Join(dir, "fill.fio"), env); err != nil {
					return err
				}
				// A degraded system loses its last nodes once filled.
				if cs, ok := parseClusterSystem(sys); ok {
					for _, n := range nodes[len(nodes)-cs.down:] {
						n.Kill()
					}
				}
				return nil
			},
			run: func(job string) (Result, error) {
				if nativeJobs[job] {
					return runNative(ctx, uri, job, opt.Size, opt.Runtime, opt.Ramp)
				}
				return runFio(ctx, filepath.Join(dir, job+".fio"), env)
			},
		}, nil
	})
	if err != nil {
		return nil, err
	}
	for _, job := range opt.Jobs {
		for _, base := range opt.Systems {
			if base != "pd3" && base != "pd3-persist" && iops[base][job] > 0 && iops["pd3"][job] > 0 {
				rep.Ratios["pd3/"+base+"@"+job] = iops["pd3"][job] / iops[base][job]
			}
		}
		// The ceiling's own ratios: the most pd3's could be.
		for _, peer := range []string{"nbdkit-cache-nbd", "nbdkit-memory"} {
			if iops["go-relay-nbdkit-memory"][job] > 0 && iops[peer][job] > 0 {
				rep.Ratios["go-relay-nbdkit-memory/"+peer+"@"+job] = iops["go-relay-nbdkit-memory"][job] / iops[peer][job]
			}
		}
		for _, local := range []string{"pd3-local", "pd3-local-poll"} {
			if iops[local][job] > 0 && iops["nbdkit-memory"][job] > 0 {
				rep.Ratios[local+"/nbdkit-memory@"+job] = iops[local][job] / iops["nbdkit-memory"][job]
			}
		}
		if iops["pd3"][job] > 0 && iops["pd3-persist"][job] > 0 {
			rep.Ratios["pd3-persist/pd3@"+job] = iops["pd3-persist"][job] / iops["pd3"][job]
		}
		if iops["pd3-r1"][job] > 0 && iops["pd3-r2"][job] > 0 {
			rep.Ratios["pd3-r2/pd3-r1@"+job] = iops["pd3-r2"][job] / iops["pd3-r1"][job]
		}
		// Each coded system against each replicated one, both whole.
		for _, e := range opt.Systems {
			for _, r := range opt.Systems {
				ce, okE := parseClusterSystem(e)
				cr, okR := parseClusterSystem(r)
				if okE && okR && ce.placement[0] == "--ec" && cr.placement[0] == "--replicas" && ce.down+cr.down == 0 && iops[e][job] > 0 && iops[r][job] > 0 {
					rep.Ratios[e+"/"+r+"@"+job] = iops[e][job] / iops[r][job]
				}
			}
		}
		// A degraded system against itself whole.
		for _, sys := range opt.Systems {
			if cs, ok := parseClusterSystem(sys); ok && cs.down > 0 && iops[sys][job] > 0 && iops[cs.whole][job] > 0 {
				rep.Ratios[sys+"/"+cs.whole+"@"+job] = iops[sys][job] / iops[cs.whole][job]
			}
		}
	}
	// Memory at the nodes per byte stored, from the median runs.
	for _, r := range rep.Results {
		if cs, ok := parseClusterSystem(r.System); ok && cs.down == 0 && r.MemnodeStored > 0 && r.Config == opt.Jobs[len(opt.Jobs)-1] {
			rep.Ratios["memory/stored:"+r.System] = float64(r.MemnodeStored) / float64(opt.Size)
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("fio ioengine=nbd, 4 KiB, %v per job after %v ramp, export of %s filled first; pd3: memory node in its own process, %s host cache, embedded agent; nbdkit memory and go-nbd keep the data in their own memory",
		opt.Runtime, opt.Ramp, units.FormatSize(opt.Size), units.FormatSize(opt.Cache)))
	return rep, nil
}

// startNBDSystem starts a server and returns its URI, the process to
// measure, pd3's memory node (nil for the others), and a stop function.
func startNBDSystem(ctx context.Context, opt NBDOptions, sys string) (string, *Child, Nodes, func(), error) {
	size := strconv.FormatUint(opt.Size, 10)
	switch sys {
	case "pd3-local", "pd3-local-poll":
		args := []string{"serve", "--local", "--volume", "disk0:" + size, "--nbd", "127.0.0.1:0", "--page", ""}
		if sys == "pd3-local-poll" {
			args = append(args, "--nbd-poll-for", "50us")
		}
		host, err := StartChild(ctx, opt.Exe, []string{"NBD server"}, args...)
		if err != nil {
			return "", nil, nil, nil, err
		}
		return "nbd://" + host.Addrs["NBD server"] + "/disk0", host, nil, host.Stop, nil
	case "pd3", "pd3-persist":
		args := []string{"memnode", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"}
		var dir string
		if sys == "pd3-persist" {
			var err error
			if dir, err = os.MkdirTemp("", "pd3-persist-"); err != nil {
				return "", nil, nil, nil, err
			}
			args = append(args, "--persist", dir)
		}
		node, err := StartChild(ctx, opt.Exe, []string{"memory node", "metrics"}, args...)
		if err != nil {
			os.RemoveAll(dir)
			return "", nil, nil, nil, err
		}
		host, err := StartChild(ctx, opt.Exe, []string{"NBD server"}, "serve", "--memnode", node.Addrs["memory node"],
			"--volume", "disk0:"+size, "--cache", strconv.FormatUint(opt.Cache, 10), "--nbd", "127.0.0.1:0", "--page", "", "--dpu", "embedded")
		if err != nil {
			node.Stop()
			os.RemoveAll(dir)
			return "", nil, nil, nil, err
		}
		return "nbd://" + host.Addrs["NBD server"] + "/disk0", host, Nodes{node}, func() { host.Stop(); node.Stop(); os.RemoveAll(dir) }, nil
	case "go-nbd":
		srv, err := StartChild(ctx, opt.Exe, []string{"go-nbd server"}, "bench", "gonbd-server", "--listen", "127.0.0.1:0", "--size", size)
		if err != nil {
			return "", nil, nil, nil, err
		}
		return "nbd://" + srv.Addrs["go-nbd server"] + "/disk0", srv, nil, srv.Stop, nil
	case "nbdkit-memory":
		c, addr, err := startNbdkit(ctx, nil, "memory", size)
		if err != nil {
			return "", nil, nil, nil, err
		}
		return "nbd://" + addr, c, nil, c.Stop, nil
	case "go-relay-nbdkit-memory":
		remote, raddr, err := startNbdkit(ctx, nil, "memory", size)
		if err != nil {
			return "", nil, nil, nil, err
		}
		relay, err := StartChild(ctx, opt.Exe, []string{"crossing server"}, "bench", "crossing-server", "--listen", "127.0.0.1:0", "--proxy", "--forward", raddr)
		if err != nil {
			remote.Stop()
			return "", nil, nil, nil, err
		}
		return "nbd://" + relay.Addrs["crossing server"], relay, Nodes{remote}, func() { relay.Stop(); remote.Stop() }, nil
	case "nbdkit-cache-nbd", "nbdkit-readahead-cache-nbd":
		front, remote, addr, err := startNbdkitCacheChain(ctx, opt.Size, opt.Cache, sys == "nbdkit-readahead-cache-nbd")
		if err != nil {
			return "", nil, nil, nil, err
		}
		return "nbd://" + addr, front, Nodes{remote}, func() { front.Stop(); remote.Stop() }, nil
	}
	if cs, ok := parseClusterSystem(sys); ok {
		return startCluster(ctx, opt.Exe, opt.Cache, size, cs)
	}
	return "", nil, nil, nil, fmt.Errorf("unknown NBD system %q (have %v)", sys, NBDSystems)
}

// clusterSystem is a pd3 system over a control plane and memory nodes
// in processes of their own: pd3-rN (--replicas N over max(2, N) nodes)
// or pd3-ecK+M (--ec K+M over K+M nodes), then -noagent for --dpu none,
// -nN for N nodes if more, -downN for N nodes killed once the export is
// filled (degraded: reads decode, writes drop shards).
type clusterSystem struct {
	placement []string // the host's --replicas or --ec
	nodes     int
	dpu       string
	down      int    // nodes killed once the export is filled (-downN)
	whole     string // the system's name without -downN
}

func parseClusterSystem(sys string) (clusterSystem, bool) {
	cs := clusterSystem{dpu: "embedded"}
	suffix := func(name string) (int, bool) {
		i := strings.LastIndex(sys, name)
		if i <= 0 {
			return 0, true
		}
		n, err := strconv.Atoi(sys[i+len(name):])
		if err != nil {
			return 0, true // not this suffix: -noagent
		}
		sys = sys[:i]
		return n, n >= 1 && n <= 16
	}
	down, ok1 := suffix("-down")
	cs.whole = sys
	nodes, ok2 := suffix("-n")
	if !ok1 || !ok2 {
		return cs, false
	}
	cs.down = down
	rest, noAgent := strings.CutSuffix(sys, "-noagent")
	if noAgent {
		cs.dpu = "none"
	}
	if r, ok := strings.CutPrefix(rest, "pd3-r"); ok {
		n, err := strconv.Atoi(r)
		if err != nil || n < 1 || n > 5 {
			return cs, false
		}
		cs.placement, cs.nodes = []string{"--replicas", r}, max(2, n, nodes)
		return cs, down < n // a copy of every extent left
	}
	if code, ok := strings.CutPrefix(rest, "pd3-ec"); ok {
		k, m, ok := strings.Cut(code, "+")
		kn, err1 := strconv.Atoi(k)
		mn, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || kn < 1 || mn < 1 || kn+mn > 16 {
			return cs, false
		}
		cs.placement, cs.nodes = []string{"--ec", code}, max(kn+mn, nodes)
		return cs, down <= mn // K shards of every row left
	}
	return cs, false
}

// startCluster starts a control plane, cs.nodes memory nodes registered
// with it and a host serving a volume of size placed as cs says (hostArgs
// added to its command line); the nodes are measured together.
func startCluster(ctx context.Context, exe string, cache uint64, size string, cs clusterSystem, hostArgs ...string) (string, *Child, Nodes, func(), error) {
	dir, err := os.MkdirTemp("", "pd3-coord-")
	if err != nil {
		return "", nil, nil, nil, err
	}
	var children []*Child
	stop := func() {
		for _, c := range slices.Backward(children) {
			c.Stop()
		}
		os.RemoveAll(dir)
	}
	coord, err := StartChild(ctx, exe, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", dir)
	if err != nil {
		stop()
		return "", nil, nil, nil, err
	}
	children = append(children, coord)
	etcd := coord.Addrs["etcd"]
	var nodes Nodes
	for range cs.nodes {
		node, err := StartChild(ctx, exe, []string{"memory node", "metrics"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd, "--metrics", "127.0.0.1:0")
		if err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		children, nodes = append(children, node), append(nodes, node)
	}
	args := append([]string{"serve", "--etcd", etcd, "--volume", "disk0:" + size, "--cache", strconv.FormatUint(cache, 10),
		"--nbd", "127.0.0.1:0", "--page", "", "--dpu", cs.dpu}, cs.placement...)
	host, err := StartChild(ctx, exe, []string{"NBD server"}, append(args, hostArgs...)...)
	if err != nil {
		stop()
		return "", nil, nil, nil, err
	}
	children = append(children, host)
	return "nbd://" + host.Addrs["NBD server"] + "/disk0", host, nodes, stop, nil
}

// freePort is a loopback port for a peer started by port number.
func freePort() (int, error) {
	ports, err := loopport.Free(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// suiteSystem is one system of a benchmark suite: the process to measure
// (nil: none), how to fill it, run a job on it, and stop it.
type suiteSystem struct {
	proc  *Child
	nodes Nodes // the memory nodes (or a peer's remote), measured too
	stop  func()
	fill  func() error
	run   func(job string) (Result, error)
}

// errSkip is a job's answer on a system it does not apply to (dbench on
// a FUSE daemon that serves one file): no result, no failure.
var errSkip = errors.New("bench: the job does not apply to this system")

// runSuite starts each system, fills it, runs every job on it (measuring
// the process) and stops it; results go to rep and the returned IOPS are
// by system and job, for ratios. With rounds > 1 it does that rounds
// times, the systems taking turns in fresh processes, and reports each
// system's median run of each job: on a shared VM one run of a system
// swings by a fifth, and a ratio of two single runs by more.
func runSuite(rep *Report, progress Progress, rounds int, systems, jobs []string, start func(sys string) (suiteSystem, error)) (map[string]map[string]float64, error) {
	rounds = max(rounds, 1)
	runs := map[string]map[string][]Result{}
	pr := progressOr(progress)
	pr.Begin(rounds * len(systems) * (2 + len(jobs)))
	defer pr.End()
	for round := 1; round <= rounds; round++ {
		at := ""
		if rounds > 1 {
			at = fmt.Sprintf(" (round %d/%d)", round, rounds)
		}
		for _, sys := range systems {
			if runs[sys] == nil {
				runs[sys] = map[string][]Result{}
			}
			if err := runSystem(rep, pr, sys, at, jobs, start, runs[sys]); err != nil {
				return nil, err
			}
		}
	}
	iops := map[string]map[string]float64{}
	for _, sys := range systems {
		iops[sys] = map[string]float64{}
		for _, job := range jobs {
			if rs := runs[sys][job]; len(rs) > 0 {
				r := medianRun(rs)
				rep.Results = append(rep.Results, r)
				iops[sys][job] = r.OpsPerSec
			}
		}
	}
	if rounds > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("each row is its system's median run of %d (by ops/s, whole: latency and CPU from the same run), the systems taking turns in fresh processes; \"runs ops/s\" is the range; ratios are of the medians", rounds))
	}
	return iops, nil
}

// runSystem starts sys, fills it, runs every job on it (adding each run
// to runs by job), notes its idle CPU and stops it; at names the round.
func runSystem(rep *Report, pr Progress, sys, at string, jobs []string, start func(sys string) (suiteSystem, error), runs map[string][]Result) error {
	pr.Step(sys + ": starting" + at)
	s, err := start(sys)
	if err != nil {
		return fmt.Errorf("%s: %w", sys, err)
	}
	defer s.stop()
	pr.Step(sys + ": filling" + at)
	if err := s.fill(); err != nil {
		return fmt.Errorf("%s: filling: %w", sys, err)
	}
	for _, job := range jobs {
		pr.Step(sys + ": " + job + at)
		r, err := measured(s.proc, s.nodes, sys, job, func() (Result, error) { return s.run(job) })
		if errors.Is(err, errSkip) {
			continue
		}
		if err != nil {
			return err
		}
		runs[job] = append(runs[job], r)
	}
	if note := idleCPU(sys, s.proc, s.nodes); note != "" {
		rep.Notes = append(rep.Notes, note+at)
	}
	return nil
}

// measured runs one fio job and adds the server's CPU per operation and
// RSS (proc may be nil: nothing to measure), and the memory nodes': their
// CPU and RSS, summed, and, where they serve /metrics (pd3 memnode
// --metrics), the bytes they store.
func measured(proc *Child, nodes Nodes, sys, job string, run func() (Result, error)) (Result, error) {
	var cpu0 time.Duration
	if proc != nil {
		cpu0 = proc.CPU()
	}
	ncpu0 := nodes.CPU()
	r, err := run()
	if err != nil {
		return r, fmt.Errorf("%s %s: %w", sys, job, err)
	}
	r.System, r.Config = sys, job
	if proc != nil {
		if r.Ops > 0 {
			r.HostCPUusOp = us(proc.CPU()-cpu0) / float64(r.Ops)
		}
		r.HostRSS = proc.RSS()
	}
	if nodes.Any() {
		if r.Ops > 0 {
			r.MemnodeCPUusOp = us(nodes.CPU()-ncpu0) / float64(r.Ops)
		}
		r.MemnodeRSS = nodes.RSS()
		r.MemnodeStored = nodes.Stored(context.Background())
	}
	return r, nil
}

// runFio runs a job file and returns its aggregate IOPS and latencies.
func runFio(ctx context.Context, job string, env []string) (Result, error) {
	return runFioArgs(ctx, []string{job}, env)
}

// runFioArgs runs fio with args (a job file, or options).
func runFioArgs(ctx context.Context, args []string, env []string) (Result, error) {
	cmd := exec.CommandContext(ctx, "fio", append([]string{"--output-format=json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return runFioCmd(cmd, args[0])
}

// runFioCmd runs a fio command that prints JSON (--output-format=json)
// and returns its aggregate IOPS and latencies; job names it in errors.
func runFioCmd(cmd *exec.Cmd, job string) (Result, error) {
	out, err := cmd.Output()
	if err != nil {
		return Result{}, fmt.Errorf("fio %s: %w", filepath.Base(job), exitText(err))
	}
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  fioStats
			Write fioStats
		} `json:"jobs"`
	}
	// The nbd engine prints "fio: connected to NBD server" before the JSON.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		return Result{}, fmt.Errorf("fio %s: unreadable output", filepath.Base(job))
	}
	j := res.Jobs[0]
	st := j.Read
	if j.Write.IOPS > st.IOPS {
		st = j.Write
	}
	r := Result{Ops: st.TotalIOs, OpsPerSec: st.IOPS, GBytesPerSec: st.BwBytes / 1e9,
		P50us: st.ClatNs.Percentile["50.000000"] / 1e3, P99us: st.ClatNs.Percentile["99.000000"] / 1e3}
	if j.Error != 0 {
		r.Errors = uint64(j.Error)
		return r, fmt.Errorf("fio %s reported error %d", filepath.Base(job), j.Error)
	}
	return r, nil
}

type fioStats struct {
	IOPS     float64 `json:"iops"`
	TotalIOs uint64  `json:"total_ios"`
	BwBytes  float64 `json:"bw_bytes"`
	ClatNs   struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// ServeGoNBD serves a memory-backed export "disk0" of size bytes with the
// go-nbd reference server (serial per connection), until ctx ends.
func ServeGoNBD(ctx context.Context, ln net.Listener, size uint64) error {
	b := backend.NewMemoryBackend(make([]byte, size))
	exports := []*server.Export{{Name: "disk0", Backend: b}}
	var g netsrv.Group
	defer g.Close()
	return g.Serve(ctx, ln, func(nc net.Conn) {
		server.Handle(nc, exports, &server.Options{SupportsMultiConn: true, MaximumBlockSize: 32 << 20})
	})
}

// idleWindow is how long idleCPU watches a system with no client.
const idleWindow = 2 * time.Second

// idleCPU reports the CPU a system's processes use with no client at all
// (after its jobs): waiting for work must cost nothing, whatever the
// system does to shorten a request's path.
func idleCPU(sys string, proc *Child, nodes Nodes) string {
	if proc == nil {
		return ""
	}
	c0, n0 := proc.CPU(), nodes.CPU()
	time.Sleep(idleWindow)
	note := fmt.Sprintf("%s idle for %v with no client: server CPU %.1f%%", sys, idleWindow, 100*float64(proc.CPU()-c0)/float64(idleWindow))
	if nodes.Any() {
		note += fmt.Sprintf(", remote/memory nodes CPU %.1f%%", 100*float64(nodes.CPU()-n0)/float64(idleWindow))
	}
	return note
}

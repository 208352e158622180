package bench

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/hist"
	"github.com/pd3-go/pd3/internal/pacer"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// PageOptions configure the page-server benchmark.
type PageOptions struct {
	Exe      string
	Systems  []string // see PageSystems
	Dataset  uint64
	Cache    uint64
	LZ       uint64 // Loading Zone bytes for pd3, pd3-split and leap
	Clients  int    // connections
	Depth    int    // requests in flight per connection
	Duration time.Duration
	Warmup   time.Duration
	Dists    []string
	Workers  []int
	// FixedLoad, if > 0, adds an open-loop run of every system at this
	// fraction of sync's peak throughput measured in the same run.
	FixedLoad float64
	// Arrivals spaces the open-loop GETs (Poisson by default).
	Arrivals pacer.Arrivals
	// Sweep varies "cache" or "lz" over Values (the other settings fixed).
	Sweep  string
	Values []uint64
	// Rounds runs every system this many times, the systems taking turns,
	// and keeps each one's median run (by throughput): on shared cores a
	// single run swings by a fifth, and turns spread slow spells over
	// every system. Default 1.
	Rounds int
}

// PageSystems lists the systems Page knows: local (all data in host
// memory), sync (cache + direct memory-node reads), leap (sync + Leap's
// host-side prefetcher), pd3 (cache + embedded DPU agent prefetching into
// the Loading Zone) and pd3-split (the agent as its own process, its CPU
// reported apart from the host's); pd3-packet and pd3-split-packet are
// those two with the AF_PACKET mirror instead of the connection tap.
//
// sync-deep is sync with one worker per request in flight (connections ×
// depth): the same cache and memory node, every miss read where it
// happens, enough of them at once to keep as many reads in flight as
// pd3's agent does. It does the least a host must do for a GET that
// misses (look up, evict, read remotely, place, answer) and nothing for
// prefetching: the ceiling of a page server over remote memory that
// does pd3's work, where relay-local does none of it.
//
// relay-local is the ceiling of any page server whose data is remote, as
// go-relay-nbdkit-memory is for NBD: a Go process that only relays bytes
// (each direction on a goroutine sleeping in poll(2), as pd3's host
// reads) in front of local in a process of its own, so every GET makes a
// miss's four crossings and nothing else. Its "host CPU" is the relay's,
// and local's server stands where a memory node would.
var PageSystems = []string{"local", "sync", "sync-deep", "leap", "pd3", "pd3-split", "pd3-packet", "pd3-split-packet", "relay-local"}

// ParseSweep reads "cache=16MiB..1GiB" (doubling from the first value to
// the last) or "lz=1MiB,4MiB,16MiB".
func ParseSweep(s string) (string, []uint64, error) {
	name, spec, ok := strings.Cut(s, "=")
	if !ok || (name != "cache" && name != "lz") {
		return "", nil, fmt.Errorf("bad sweep %q: want cache=A..B or lz=A..B", s)
	}
	if lo, hi, ok := strings.Cut(spec, ".."); ok {
		a, err1 := units.ParseSize(lo)
		b, err2 := units.ParseSize(hi)
		if err1 != nil || err2 != nil || a == 0 || a > b {
			return "", nil, fmt.Errorf("bad sweep range %q", spec)
		}
		var vs []uint64
		for v := a; v <= b; v *= 2 {
			vs = append(vs, v)
		}
		return name, vs, nil
	}
	var vs []uint64
	for _, p := range strings.Split(spec, ",") {
		v, err := units.ParseSize(p)
		if err != nil {
			return "", nil, err
		}
		vs = append(vs, v)
	}
	return name, vs, nil
}

// Page runs random page GETs against each system and configuration.
func Page(ctx context.Context, opt PageOptions) (*Report, error) {
	if opt.Clients <= 0 {
		opt.Clients = 4
	}
	if opt.Depth <= 0 {
		opt.Depth = 8
	}
	if len(opt.Dists) == 0 {
		opt.Dists = []string{"uniform"}
	}
	if len(opt.Workers) == 0 {
		opt.Workers = []int{0}
	}
	for _, s := range opt.Systems {
		if !slices.Contains(PageSystems, s) {
			return nil, fmt.Errorf("unknown system %q (have %v)", s, PageSystems)
		}
	}
	if opt.FixedLoad > 0 && !slices.Contains(opt.Systems, "sync") {
		return nil, fmt.Errorf("--fixed-load is a fraction of sync's peak: include sync in --systems")
	}
	sweep := []uint64{0}
	if opt.Sweep != "" {
		sweep = opt.Values
	}
	rep := &Report{Bench: "page", Machine: Machine(), Ratios: map[string]float64{}}
	multi := len(opt.Dists)*len(opt.Workers)*len(sweep) > 1
	for _, dspec := range opt.Dists {
		dist, err := workload.Parse(dspec, opt.Dataset/pageid.Size)
		if err != nil {
			return nil, err
		}
		for _, t := range opt.Workers {
			for _, sv := range sweep {
				o := opt
				cfg := fmt.Sprintf("dist=%s T=%s", dist, workersName(t))
				switch opt.Sweep {
				case "cache":
					o.Cache = sv
					cfg += " cache=" + units.FormatSize(sv)
				case "lz":
					o.LZ = sv
					cfg += " lz=" + units.FormatSize(sv)
				}
				suffix := ""
				if multi {
					suffix = "@" + cfg
				}
				if err := pageConfig(ctx, o, rep, dist, t, cfg, suffix); err != nil {
					return nil, err
				}
			}
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("dataset %s, cache %s, Loading Zone %s, %d connections × %d in flight, %v measured after %v warm-up; memory node, host (and pd3-split's agent) are separate processes",
		units.FormatSize(opt.Dataset), units.FormatSize(opt.Cache), units.FormatSize(opt.LZ), opt.Clients, opt.Depth, opt.Duration, opt.Warmup))
	if slices.Contains(opt.Systems, "sync-deep") {
		rep.Notes = append(rep.Notes, fmt.Sprintf("sync-deep = sync with %d workers, one per request in flight, whatever T says", opt.Clients*opt.Depth))
	}
	if opt.Rounds > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("closed-loop rows: each system's median of %d runs by GETs/s, the systems taking turns; ratios are of those runs", opt.Rounds))
	}
	if opt.FixedLoad > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("rows with load=R: open loop at R GETs/s = %.2f × sync's peak, %s arrivals; latency from each request's scheduled send time (send delay: how late the requester sent it)", opt.FixedLoad, opt.Arrivals))
	}
	return rep, nil
}

// pageConfig measures every system in one configuration and adds the
// results and ratios to rep.
func pageConfig(ctx context.Context, opt PageOptions, rep *Report, dist workload.Dist, t int, cfg, suffix string) error {
	runs := map[string][]Result{}
	for round := 0; round < max(opt.Rounds, 1); round++ {
		for _, sys := range opt.Systems {
			r, err := runPageSystem(ctx, opt, sys, dist, t, 0)
			if err != nil {
				return fmt.Errorf("%s (%s): %w", sys, cfg, err)
			}
			runs[sys] = append(runs[sys], r)
		}
	}
	byName := map[string]Result{}
	for _, sys := range opt.Systems {
		r := medianRun(runs[sys])
		r.Config = cfg
		rep.Results = append(rep.Results, r)
		byName[sys] = r
	}
	for _, a := range opt.Systems {
		for _, b := range opt.Systems {
			if a != b && byName[b].OpsPerSec > 0 {
				rep.Ratios[a+"/"+b+suffix] = byName[a].OpsPerSec / byName[b].OpsPerSec
			}
		}
	}
	// Host CPU per GET: the split agent's host is the honest "pd3" host.
	if l, ok := byName["local"]; ok && l.HostCPUusOp > 0 {
		for _, c := range []string{"relay-local", "sync-deep"} {
			if r, ok := byName[c]; ok {
				rep.Ratios["cpu:"+c+"/local"+suffix] = r.HostCPUusOp / l.HostCPUusOp
			}
		}
		for _, p := range []string{"pd3-split", "pd3"} {
			if r, ok := byName[p]; ok {
				rep.Ratios["cpu:pd3/local"+suffix] = r.HostCPUusOp / l.HostCPUusOp
				break
			}
		}
		for _, p := range []string{"pd3-packet", "pd3-split-packet"} {
			if r, ok := byName[p]; ok {
				rep.Ratios["cpu:"+p+"/local"+suffix] = r.HostCPUusOp / l.HostCPUusOp
			}
		}
	}
	for _, sys := range []string{"sync", "sync-deep", "leap", "pd3", "pd3-split"} {
		r, ok := byName[sys]
		if !ok {
			continue
		}
		lz := uint64(0)
		if !strings.HasPrefix(sys, "sync") {
			lz = opt.LZ
		}
		rep.Ratios["memnode_rss/stored:"+sys+suffix] = float64(r.MemnodeRSS) / float64(r.MemnodeStored)
		rep.Ratios["host_rss/(cache+lz+64MiB):"+sys+suffix] = float64(r.HostRSS) / float64(opt.Cache+lz+64<<20)
	}
	if opt.FixedLoad <= 0 {
		return nil
	}
	rate := opt.FixedLoad * byName["sync"].OpsPerSec
	fixed := map[string]Result{}
	for _, sys := range opt.Systems {
		r, err := runPageSystem(ctx, opt, sys, dist, t, rate)
		if err != nil {
			return fmt.Errorf("%s (%s, fixed load): %w", sys, cfg, err)
		}
		r.Config = fmt.Sprintf("%s load=%.0f/s", cfg, rate)
		rep.Results = append(rep.Results, r)
		fixed[sys] = r
	}
	pd3 := "pd3"
	if _, ok := fixed["pd3-split"]; ok {
		pd3 = "pd3-split"
	}
	for _, base := range []string{"local", "sync"} {
		if b, ok := fixed[base]; ok && b.P99us > 0 {
			if p, ok := fixed[pd3]; ok {
				rep.Ratios["p99:pd3/"+base+suffix] = p.P99us / b.P99us
			}
			for _, p := range []string{"pd3-packet", "pd3-split-packet"} {
				if r, ok := fixed[p]; ok {
					rep.Ratios["p99:"+p+"/"+base+suffix] = r.P99us / b.P99us
				}
			}
		}
	}
	return nil
}

// medianRun is the run of median throughput (the lower middle of an even
// count), whole: its latency and CPU belong to the same run.
// With more than one run it keeps every run's throughput.
func medianRun(rs []Result) Result {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int { return cmp.Compare(a.OpsPerSec, b.OpsPerSec) })
	m := rs[(len(rs)-1)/2]
	if len(rs) > 1 {
		m.RoundsOpsPerSec = make([]float64, len(rs))
		for i, r := range rs {
			m.RoundsOpsPerSec[i] = r.OpsPerSec
		}
	}
	return m
}

func workersName(t int) string {
	if t <= 0 {
		return "CPUs"
	}
	return strconv.Itoa(t)
}

var splitSeq atomic.Uint64

// runPageSystem starts the system's processes, loads it (closed loop, or
// open loop at rate GETs/s when rate > 0) and stops them.
func runPageSystem(ctx context.Context, opt PageOptions, sys string, dist workload.Dist, workers int, rate float64) (Result, error) {
	vol := "disk0:" + strconv.FormatUint(opt.Dataset, 10)
	if sys == "sync-deep" {
		workers = opt.Clients * opt.Depth
	}
	args := []string{"serve", "--page", "127.0.0.1:0", "--volume", vol, "--cache", strconv.FormatUint(opt.Cache, 10),
		"--workers", strconv.Itoa(workers), "--metrics", "127.0.0.1:0"}
	if sys == "relay-local" {
		return runPageRelay(ctx, opt, args, dist, rate)
	}
	lz := strconv.FormatUint(opt.LZ, 10)
	var node, agent *Child
	var startAgent func(hostAddr string) (*Child, error)
	if sys != "local" {
		var err error
		node, err = StartChild(ctx, opt.Exe, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
		if err != nil {
			return Result{}, err
		}
		defer node.Stop()
		c, err := memnode.Dial(ctx, node.Addrs["memory node"], memnode.ClientOptions{})
		if err != nil {
			return Result{}, err
		}
		v, err := c.Create(ctx, "disk0", opt.Dataset)
		if err == nil {
			err = Populate(ctx, c, v)
		}
		c.Close()
		if err != nil {
			return Result{}, err
		}
		args = append(args, "--memnode", node.Addrs["memory node"])
	}
	switch sys {
	case "local":
		args = append(args, "--local", "--dpu", "none")
	case "sync", "sync-deep":
		args = append(args, "--dpu", "none")
	case "leap":
		args = append(args, "--dpu", "none", "--prefetch", "leap", "--lz", lz)
	case "pd3":
		args = append(args, "--dpu", "embedded", "--lz", lz)
	case "pd3-packet":
		args = append(args, "--dpu", "embedded", "--lz", lz, "--mirror", "packet")
	case "pd3-split", "pd3-split-packet":
		name := fmt.Sprintf("bench%d-%d", os.Getpid(), splitSeq.Add(1))
		agentArgs := []string{"dpu", "--memnode", node.Addrs["memory node"], "--shm", name, "--lz", lz, "--cache", strconv.FormatUint(opt.Cache, 10)}
		args = append(args, "--dpu", "shm:"+name)
		if sys == "pd3-split-packet" {
			// The agent watches the host's port, so the host starts first
			// (serving directly until the agent attaches) and does not tap.
			args = append(args, "--mirror", "none")
			defer func() {
				if agent != nil {
					agent.Stop()
				}
			}()
			startAgent = func(hostAddr string) (*Child, error) {
				return StartChild(ctx, opt.Exe, []string{"dpu agent"}, append(agentArgs, "--packet", "page="+hostAddr)...)
			}
			break
		}
		var err error
		agent, err = StartChild(ctx, opt.Exe, []string{"dpu agent"}, agentArgs...)
		if err != nil {
			return Result{}, err
		}
		defer agent.Stop()
	}
	host, err := StartChild(ctx, opt.Exe, []string{"page server", "metrics"}, args...)
	if err != nil {
		return Result{}, err
	}
	defer host.Stop()
	if startAgent != nil {
		if agent, err = startAgent(host.Addrs["page server"]); err != nil {
			return Result{}, err
		}
	}

	lr, err := loadPages(ctx, host.Addrs["page server"], host.Addrs["metrics"], host, agent, node, opt, dist, rate)
	if err != nil {
		return Result{}, err
	}
	lr.System = sys
	lr.HostRSS = host.RSS()
	if node != nil {
		lr.MemnodeRSS = node.RSS()
		lr.MemnodeStored = (opt.Dataset + memnode.ChunkSize - 1) &^ (memnode.ChunkSize - 1)
	}
	return lr, nil
}

// runPageRelay measures relay-local: local's server (args) behind a byte
// relay, the relay's CPU counted as the host's and the server's as a
// memory node's.
func runPageRelay(ctx context.Context, opt PageOptions, args []string, dist workload.Dist, rate float64) (Result, error) {
	server, err := StartChild(ctx, opt.Exe, []string{"page server", "metrics"}, append(args, "--local", "--dpu", "none")...)
	if err != nil {
		return Result{}, err
	}
	defer server.Stop()
	relay, err := StartChild(ctx, opt.Exe, []string{"crossing server"}, "bench", "crossing-server", "--listen", "127.0.0.1:0", "--proxy", "--forward", server.Addrs["page server"])
	if err != nil {
		return Result{}, err
	}
	defer relay.Stop()
	lr, err := loadPages(ctx, relay.Addrs["crossing server"], server.Addrs["metrics"], relay, nil, server, opt, dist, rate)
	lr.System = "relay-local"
	lr.HostRSS = relay.RSS()
	return lr, err
}

// loadPages drives GETs from opt.Clients connections with opt.Depth
// requesters each and measures after the warm-up. With rate > 0 the
// requesters send on a schedule kept by a pacer (open loop) and latency
// counts from the scheduled time, so queueing behind a slow request is not
// hidden.
func loadPages(ctx context.Context, addr, metrics string, host, agent, node *Child, opt PageOptions, dist workload.Dist, rate float64) (Result, error) {
	conns := make([]*pageproto.Client, opt.Clients)
	for i := range conns {
		c, err := pageproto.Dial(ctx, addr, pageproto.ClientOptions{})
		if err != nil {
			return Result{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	var measuring, stop atomic.Bool
	var errs atomic.Uint64
	var firstErr atomic.Value
	n := opt.Clients * opt.Depth
	hs := make([]hist.H, n)
	delays := make([]hist.H, n) // scheduled → sent, open loop only
	// Open loop: one pacer schedules every GET; a free requester sends it.
	// When all n are busy the schedule backs up and the wait counts.
	var sched chan time.Time
	pctx, stopPacer := context.WithCancel(ctx)
	defer stopPacer()
	if rate > 0 {
		sched = make(chan time.Time, n)
		go pacer.Run(pctx, rate, opt.Arrivals, 1, sched)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns[i%opt.Clients]
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			buf := make([]byte, pageid.Size)
			h := &hs[i]
			for {
				var t0 time.Time
				if sched != nil {
					s, ok := <-sched
					if !ok {
						return
					}
					t0 = s
					if measuring.Load() {
						delays[i].Record(time.Since(s))
					}
				} else {
					if stop.Load() {
						return
					}
					t0 = time.Now()
				}
				k := pageid.MakeKey(1, dist.Next(rng))
				err := c.Get(ctx, k, buf)
				d := time.Since(t0)
				if err == nil && !workload.CheckPage(k, buf) {
					err = fmt.Errorf("page %v came back with the content of another page", k)
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					if ctx.Err() != nil {
						return
					}
					continue
				}
				if measuring.Load() {
					h.Record(d)
				}
			}
		}()
	}
	sleep(ctx, opt.Warmup)
	m0, err := scrapeValues(ctx, metrics)
	if err != nil {
		stop.Store(true)
		wg.Wait()
		return Result{}, err
	}
	cpu0 := host.CPU()
	var acpu0, ncpu0 time.Duration
	if agent != nil {
		acpu0 = agent.CPU()
	}
	if node != nil {
		ncpu0 = node.CPU()
	}
	t0 := time.Now()
	measuring.Store(true)
	sleep(ctx, opt.Duration)
	measuring.Store(false)
	el := time.Since(t0)
	cpu1 := host.CPU()
	var acpu1, ncpu1 time.Duration
	if agent != nil {
		acpu1 = agent.CPU()
	}
	if node != nil {
		ncpu1 = node.CPU()
	}
	m1, err := scrapeValues(ctx, metrics)
	stop.Store(true)
	stopPacer()
	wg.Wait()
	var all, delay hist.H
	for i := range hs {
		all.Merge(&hs[i])
		delay.Merge(&delays[i])
	}
	r := Result{
		Ops: all.Count(), OpsPerSec: float64(all.Count()) / el.Seconds(),
		GBytesPerSec: float64(all.Count()) * pageid.Size / el.Seconds() / 1e9,
		P50us:        us(all.Quantile(0.5)), P99us: us(all.Quantile(0.99)),
		Errors: errs.Load(), Counters: delta(m0, m1),
	}
	if delay.Count() > 0 {
		r.SendDelayP50us, r.SendDelayP99us = us(delay.Quantile(0.5)), us(delay.Quantile(0.99))
	}
	if err != nil {
		return r, err
	}
	if all.Count() > 0 {
		r.HostCPUusOp = us(cpu1-cpu0) / float64(all.Count())
		if agent != nil {
			r.AgentCPUusOp = us(acpu1-acpu0) / float64(all.Count())
		}
		if node != nil {
			r.MemnodeCPUusOp = us(ncpu1-ncpu0) / float64(all.Count())
		}
	}
	if e := firstErr.Load(); e != nil {
		return r, fmt.Errorf("%d GETs failed, first: %w", r.Errors, e.(error))
	}
	return r, ctx.Err()
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

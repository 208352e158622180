package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/hist"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// PageOptions configure the page-server benchmark.
type PageOptions struct {
	Exe      string
	Systems  []string // local, sync
	Dataset  uint64
	Cache    uint64
	Clients  int // connections
	Depth    int // requests in flight per connection
	Duration time.Duration
	Warmup   time.Duration
	Dists    []string
	Workers  []int
	LZ       uint64 // Loading Zone bytes for pd3
}

// PageSystems lists the systems Page knows: local (all data in host
// memory), sync (cache + direct memory-node reads), leap (sync + Leap's
// host-side prefetcher), pd3 (cache + embedded DPU agent prefetching into
// the Loading Zone).
var PageSystems = []string{"local", "sync", "leap", "pd3"}

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
	rep := &Report{Bench: "page", Machine: Machine(), Ratios: map[string]float64{}}
	multi := len(opt.Dists)*len(opt.Workers) > 1
	for _, dspec := range opt.Dists {
		dist, err := workload.Parse(dspec, opt.Dataset/memnode.PageSize)
		if err != nil {
			return nil, err
		}
		for _, t := range opt.Workers {
			cfg := fmt.Sprintf("dist=%s T=%s", dist, workersName(t))
			byName := map[string]Result{}
			for _, sys := range opt.Systems {
				r, err := runPageSystem(ctx, opt, sys, dist, t)
				if err != nil {
					return nil, fmt.Errorf("%s (%s): %w", sys, cfg, err)
				}
				r.Config = cfg
				rep.Results = append(rep.Results, r)
				byName[sys] = r
			}
			suffix := ""
			if multi {
				suffix = "@" + cfg
			}
			for _, a := range opt.Systems {
				for _, b := range opt.Systems {
					if a != b && byName[b].OpsPerSec > 0 {
						rep.Ratios[a+"/"+b+suffix] = byName[a].OpsPerSec / byName[b].OpsPerSec
					}
				}
			}
			for _, sys := range []string{"sync", "leap", "pd3"} {
				r, ok := byName[sys]
				if !ok {
					continue
				}
				lz := uint64(0)
				if sys == "pd3" || sys == "leap" {
					lz = opt.LZ
				}
				rep.Ratios["memnode_rss/stored:"+sys+suffix] = float64(r.MemnodeRSS) / float64(r.MemnodeStored)
				rep.Ratios["host_rss/(cache+lz+64MiB):"+sys+suffix] = float64(r.HostRSS) / float64(opt.Cache+lz+64<<20)
			}
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("dataset %s, cache %s, %d connections × %d in flight, %v measured after %v warm-up; memory node and host are separate processes",
		units.FormatSize(opt.Dataset), units.FormatSize(opt.Cache), opt.Clients, opt.Depth, opt.Duration, opt.Warmup))
	return rep, nil
}

func workersName(t int) string {
	if t <= 0 {
		return "GOMAXPROCS"
	}
	return strconv.Itoa(t)
}

func runPageSystem(ctx context.Context, opt PageOptions, sys string, dist workload.Dist, workers int) (Result, error) {
	vol := "disk0:" + strconv.FormatUint(opt.Dataset, 10)
	args := []string{"serve", "--page", "127.0.0.1:0", "--volume", vol, "--cache", strconv.FormatUint(opt.Cache, 10), "--workers", strconv.Itoa(workers)}
	var node *Child
	switch sys {
	case "sync":
		args = append(args, "--dpu", "none")
	case "leap":
		args = append(args, "--dpu", "none", "--prefetch", "leap", "--lz", strconv.FormatUint(opt.LZ, 10))
	case "pd3":
		args = append(args, "--dpu", "embedded", "--lz", strconv.FormatUint(opt.LZ, 10))
	}
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
	} else {
		args = append(args, "--local", "--dpu", "none")
	}
	args = append(args, "--metrics", "127.0.0.1:0")
	host, err := StartChild(ctx, opt.Exe, []string{"page server", "metrics"}, args...)
	if err != nil {
		return Result{}, err
	}
	defer host.Stop()

	lr, err := loadPages(ctx, host, opt, dist)
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

// loadPages drives GETs from opt.Clients connections with opt.Depth
// synchronous requesters each, and measures after the warm-up.
func loadPages(ctx context.Context, host *Child, opt PageOptions, dist workload.Dist) (Result, error) {
	conns := make([]*pageproto.Client, opt.Clients)
	for i := range conns {
		c, err := pageproto.Dial(ctx, host.Addrs["page server"], pageproto.ClientOptions{})
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
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns[i%opt.Clients]
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			buf := make([]byte, pageproto.PageSize)
			h := &hs[i]
			for !stop.Load() {
				k := memnode.MakeKey(1, dist.Next(rng))
				t0 := time.Now()
				err := c.Get(ctx, k, buf)
				d := time.Since(t0)
				if err == nil && !CheckPage(k, buf) {
					err = fmt.Errorf("page %v has the content of %v", k, memnode.Key(uint64(buf[0])|uint64(buf[1])<<8))
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
	m0, err := scrape(ctx, host.Addrs["metrics"])
	if err != nil {
		stop.Store(true)
		wg.Wait()
		return Result{}, err
	}
	cpu0 := host.CPU()
	t0 := time.Now()
	measuring.Store(true)
	sleep(ctx, opt.Duration)
	measuring.Store(false)
	el := time.Since(t0)
	cpu1 := host.CPU()
	m1, err := scrape(ctx, host.Addrs["metrics"])
	stop.Store(true)
	wg.Wait()
	var all hist.H
	for i := range hs {
		all.Merge(&hs[i])
	}
	r := Result{
		Ops: all.Count(), OpsPerSec: float64(all.Count()) / el.Seconds(),
		GBytesPerSec: float64(all.Count()) * pageproto.PageSize / el.Seconds() / 1e9,
		P50us:        us(all.Quantile(0.5)), P99us: us(all.Quantile(0.99)),
		Errors: errs.Load(), Counters: delta(m0, m1),
	}
	if err != nil {
		return r, err
	}
	if all.Count() > 0 {
		r.HostCPUusOp = us(cpu1-cpu0) / float64(all.Count())
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

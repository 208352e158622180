package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/pd3-go/pd3/hostview"
)

// HostViewOptions configure the Host View benchmark.
type HostViewOptions struct {
	Keys    int // keys in the set
	Lookups int // lookups per stage
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// HostView runs the PD3 Fig. 4 ladder and Go's built-in map on the same
// keys: lookups/s of present keys in random order, and bytes per key.
func HostView(ctx context.Context, opt HostViewOptions) (*Report, error) {
	if opt.Keys <= 0 {
		opt.Keys = 100_000_000
	}
	if opt.Lookups <= 0 {
		opt.Lookups = 20_000_000
	}
	rep := &Report{Bench: "hostview", Machine: Machine(), Ratios: map[string]float64{}}
	rng := rand.New(rand.NewPCG(11, 12))
	keys := make([]uint64, opt.Keys)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
	}
	probe := make([]uint64, opt.Lookups)
	for i := range probe {
		probe[i] = keys[rng.IntN(len(keys))]
	}
	debug.SetGCPercent(-1) // measure tables, not garbage
	defer debug.SetGCPercent(100)

	base := heapInUse()
	m := make(map[uint64]struct{})
	for _, k := range keys {
		m[k] = struct{}{}
	}
	mapBytes := heapInUse() - base
	start := time.Now()
	hits := 0
	for _, k := range probe {
		if _, ok := m[k]; ok {
			hits++
		}
	}
	el := time.Since(start)
	if hits != len(probe) {
		return nil, fmt.Errorf("map lost keys")
	}
	mapRes := Result{System: "go-map", Config: "map[uint64]struct{}", Ops: uint64(len(probe)), OpsPerSec: float64(len(probe)) / el.Seconds()}
	rep.Results = append(rep.Results, mapRes)
	m = nil
	runtime.GC()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	for _, shards := range []int{1, 2} {
		base := heapInUse()
		s := hostview.New(opt.Keys, shards)
		for _, k := range keys {
			s.Add(k)
		}
		setBytes := heapInUse() - base
		if d := s.Dropped(); d > 0 {
			return nil, fmt.Errorf("host view dropped %d keys", d)
		}
		bpk := float64(setBytes) / float64(opt.Keys)
		out := make([]bool, 64)
		check := func(o []bool) error {
			for _, ok := range o {
				if !ok {
					return fmt.Errorf("host view lost a key")
				}
			}
			return nil
		}
		if shards == 1 {
			for st := hostview.Basic; st <= hostview.Delayed; st++ {
				start := time.Now()
				for o := 0; o+64 <= len(probe); o += 64 {
					s.LookupStage(st, probe[o:o+64], out)
					if err := check(out); err != nil {
						return nil, err
					}
				}
				el := time.Since(start)
				r := Result{System: "hostview", Config: st.String(), Ops: uint64(len(probe) / 64 * 64), OpsPerSec: float64(len(probe)/64*64) / el.Seconds()}
				rep.Results = append(rep.Results, r)
				rep.Ratios["hostview-"+st.String()+"/go-map"] = r.OpsPerSec / mapRes.OpsPerSec
			}
			rep.Ratios["bytes:hostview/go-map"] = float64(setBytes) / float64(mapBytes)
			rep.Notes = append(rep.Notes, fmt.Sprintf("bytes per key: go-map %.1f, hostview %.1f", float64(mapBytes)/float64(opt.Keys), bpk))
			continue
		}
		// Two shards, one goroutine each, each looking up its shard's keys.
		parts := make([][]uint64, shards)
		for _, k := range probe {
			parts[s.ShardOf(k)] = append(parts[s.ShardOf(k)], k)
		}
		var wg sync.WaitGroup
		var errMu sync.Mutex
		var firstErr error
		start := time.Now()
		total := 0
		for _, p := range parts {
			total += len(p) / 64 * 64
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]bool, 64)
				for o := 0; o+64 <= len(p); o += 64 {
					s.ContainsBatch(p[o:o+64], out)
					if err := check(out); err != nil {
						errMu.Lock()
						firstErr = err
						errMu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		if firstErr != nil {
			return nil, firstErr
		}
		r := Result{System: "hostview", Config: "2 shards, 2 goroutines", Ops: uint64(total), OpsPerSec: float64(total) / el.Seconds()}
		rep.Results = append(rep.Results, r)
		rep.Ratios["hostview-2shards/go-map"] = r.OpsPerSec / mapRes.OpsPerSec
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("%d random 8-byte keys, %d lookups of present keys in random order per row, batches of 64", opt.Keys, opt.Lookups))
	return rep, nil
}

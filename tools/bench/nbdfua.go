package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/hist"
	"github.com/pd3-go/pd3/internal/nbdclient"
)

// nativeJobs are NBD jobs fio's nbd engine cannot run, driven by pd3's own
// client: 32 connections (the export is multi-conn) each with one request
// in flight, so Q32 in all.
var nativeJobs = map[string]bool{"randwrite-q32-fua": true}

// runNative runs a native job against uri for runtime after ramp.
func runNative(ctx context.Context, uri, job string, size uint64, runtime, ramp time.Duration) (Result, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Result{}, err
	}
	const conns = 32
	var (
		ops     atomic.Uint64
		measure atomic.Bool
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		lat     = make([]hist.H, conns)
	)
	stop := make(chan struct{})
	for i := 0; i < conns; i++ {
		c, err := nbdclient.Dial(u.Host, strings.TrimPrefix(u.Path, "/"))
		if err != nil {
			close(stop)
			wg.Wait()
			return Result{}, fmt.Errorf("%s: %w", job, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			page := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := rng.Uint64N(size/4096) * 4096
				page[0]++
				t0 := time.Now()
				if err := c.WriteFUA(off, page); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
				if measure.Load() {
					lat[i].Record(time.Since(t0))
					ops.Add(1)
				}
			}
		}()
	}
	select {
	case <-time.After(ramp):
	case <-ctx.Done():
	}
	measure.Store(true)
	t0 := time.Now()
	select {
	case <-time.After(runtime):
	case <-ctx.Done():
	}
	measure.Store(false)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	if first != nil {
		return Result{}, fmt.Errorf("%s: %w", job, first)
	}
	var all hist.H
	for i := range lat {
		all.Merge(&lat[i])
	}
	n := ops.Load()
	return Result{Ops: n, OpsPerSec: float64(n) / el.Seconds(), GBytesPerSec: float64(n) * 4096 / el.Seconds() / 1e9,
		P50us: us(all.Quantile(0.5)), P99us: us(all.Quantile(0.99))}, nil
}

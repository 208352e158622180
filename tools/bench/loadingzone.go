package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/pageid"
)

// LZOptions configure the Loading Zone benchmark.
type LZOptions struct {
	Threads []int
	Records int // pages in the zone
	Rounds  int
}

// consumer is what the benchmark drives: fill with keys 1..n (untimed),
// then take each key exactly once from many goroutines (timed).
type consumer interface {
	fill(n int, page []byte)
	take(k uint64, dst []byte) bool
}

// LoadingZone measures CheckAndReturn hits/s with 1..N consumer goroutines
// against a mutex-protected map and against a lock-free ring scanned from a
// shared Head (PD3 Fig. 7a, what PD3's Loading Zone replaced). copy-only
// is the bound of any of them: the same pages copied out by index with no
// lookup and no synchronisation at all.
func LoadingZone(ctx context.Context, opt LZOptions) (*Report, error) {
	if len(opt.Threads) == 0 {
		opt.Threads = []int{1, 2, 4, 8, 16}
	}
	if opt.Records <= 0 {
		opt.Records = 16384
	}
	if opt.Rounds <= 0 {
		opt.Rounds = 5
	}
	region, err := shm.Create("", loadingzone.Size(opt.Records))
	if err != nil {
		return nil, err
	}
	defer region.Close()
	z, err := loadingzone.Format(region.Bytes(), opt.Records, 1)
	if err != nil {
		return nil, err
	}
	systems := []struct {
		name string
		c    consumer
	}{
		{"loadingzone", zoneConsumer{z}},
		{"mutex+map", newMutexMap(opt.Records)},
		{"lockfree-ring-scan", newRingScan(opt.Records)},
		{"copy-only", newCopyOnly(opt.Records)},
	}
	rep := &Report{Bench: "loadingzone", Machine: Machine(), Ratios: map[string]float64{}}
	page := make([]byte, pageid.Size)
	for _, t := range opt.Threads {
		byName := map[string]float64{}
		for _, sys := range systems {
			var total uint64
			var el time.Duration
			for r := 0; r < opt.Rounds; r++ {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				sys.c.fill(opt.Records, page)
				n, d, err := consume(sys.c, opt.Records, t)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", sys.name, err)
				}
				total += n
				el += d
			}
			res := Result{System: sys.name, Config: "threads=" + strconv.Itoa(t), Ops: total, OpsPerSec: float64(total) / el.Seconds(),
				GBytesPerSec: float64(total) * pageid.Size / el.Seconds() / 1e9}
			rep.Results = append(rep.Results, res)
			byName[sys.name] = res.OpsPerSec
		}
		rep.Ratios[fmt.Sprintf("loadingzone/mutex+map@threads=%d", t)] = byName["loadingzone"] / byName["mutex+map"]
		rep.Ratios[fmt.Sprintf("loadingzone/lockfree-ring-scan@threads=%d", t)] = byName["loadingzone"] / byName["lockfree-ring-scan"]
		rep.Ratios[fmt.Sprintf("copy-only/mutex+map@threads=%d", t)] = byName["copy-only"] / byName["mutex+map"]
		rep.Ratios[fmt.Sprintf("loadingzone/copy-only@threads=%d", t)] = byName["loadingzone"] / byName["copy-only"]
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("%d pages of 4 KiB produced, then each consumed once by its goroutine (keys striped across goroutines, in production order); %d rounds per row; hits/s = ops/s", opt.Records, opt.Rounds))
	return rep, nil
}

func consume(c consumer, n, threads int) (uint64, time.Duration, error) {
	var wg sync.WaitGroup
	var got atomic.Uint64
	var failed atomic.Bool
	start := time.Now()
	for g := 0; g < threads; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, pageid.Size)
			for k := uint64(g + 1); k <= uint64(n); k += uint64(threads) {
				if !c.take(k, dst) {
					failed.Store(true)
					return
				}
				got.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return 0, 0, fmt.Errorf("a produced page could not be taken")
	}
	return got.Load(), time.Since(start), nil
}

type zoneConsumer struct{ z *loadingzone.Zone }

func (c zoneConsumer) fill(n int, page []byte) {
	for k := 1; k <= n; k++ {
		c.z.Place(uint64(k), page)
	}
}

func (c zoneConsumer) take(k uint64, dst []byte) bool {
	return c.z.CheckAndReturn(k, dst) == pageid.Size
}

type mutexMap struct {
	mu   sync.Mutex
	m    map[uint64]int
	data []byte
}

func newMutexMap(n int) *mutexMap {
	return &mutexMap{m: make(map[uint64]int, n), data: make([]byte, n*pageid.Size)}
}

func (c *mutexMap) fill(n int, page []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	for k := 1; k <= n; k++ {
		s := k - 1
		copy(c.data[s*pageid.Size:], page)
		c.m[uint64(k)] = s
	}
}

func (c *mutexMap) take(k uint64, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.m[k]
	if !ok {
		return false
	}
	copy(dst, c.data[s*pageid.Size:(s+1)*pageid.Size])
	delete(c.m, k)
	return true
}

// copyOnly hands out page k by copying slot k-1: what every consumer
// must do at least, without finding the page or claiming it.
type copyOnly struct{ data []byte }

func newCopyOnly(n int) *copyOnly { return &copyOnly{data: make([]byte, n*pageid.Size)} }

func (c *copyOnly) fill(n int, page []byte) {
	for s := 0; s < n; s++ {
		copy(c.data[s*pageid.Size:], page)
	}
}

func (c *copyOnly) take(k uint64, dst []byte) bool {
	s := int(k-1) * pageid.Size
	copy(dst, c.data[s:s+pageid.Size])
	return true
}

// ringScan is the lock-free ring PD3 started from: consumers scan records
// from a shared Head to Tail, CAS the state of a match, and advance Head
// past consumed records with CAS.
type ringScan struct {
	head, tail atomic.Uint64
	keys       []uint64
	state      []atomic.Uint32
	data       []byte
}

func newRingScan(n int) *ringScan {
	return &ringScan{keys: make([]uint64, n), state: make([]atomic.Uint32, n), data: make([]byte, n*pageid.Size)}
}

func (c *ringScan) fill(n int, page []byte) {
	for s := 0; s < n; s++ {
		c.keys[s] = uint64(s + 1)
		copy(c.data[s*pageid.Size:], page)
		c.state[s].Store(1)
	}
	c.head.Store(0)
	c.tail.Store(uint64(n))
}

func (c *ringScan) take(k uint64, dst []byte) bool {
	tail := c.tail.Load()
	for i := c.head.Load(); i < tail; i++ {
		if c.keys[i] != k || !c.state[i].CompareAndSwap(1, 2) {
			continue
		}
		copy(dst, c.data[i*pageid.Size:(i+1)*pageid.Size])
		// Advance Head past consumed records (head contention).
		for {
			h := c.head.Load()
			if h >= tail || c.state[h].Load() != 2 || !c.head.CompareAndSwap(h, h+1) {
				break
			}
		}
		return true
	}
	return false
}

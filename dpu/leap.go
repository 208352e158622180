package dpu

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Leap is the host-side prefetcher of Leap (Al Maruf & Chowdhury, ATC'20),
// the baseline PD3 compares against: it predicts from the history of the
// host's own misses, not from requests it has not executed yet.
//
// It keeps the last 32 page deltas, looks for a majority delta
// (Boyer–Moore) in the most recent 8, then 16, then 32, and on a trend Δ
// prefetches page + i·Δ for i = 1..depth. The depth follows the prefetch
// hits since the last prediction: hits + 2 rounded up to a power of two,
// clamped to [4, 8], and never below half the previous depth.
type Leap struct {
	mu      sync.Mutex
	hist    [32]int64
	n       int // deltas recorded (saturates at len(hist))
	pos     int // next write position in hist
	last    uint64
	started bool
	depth   int
	hits    func() uint64 // cumulative prefetch hits (Loading Zone)
	lastHit uint64

	// Predictions counts misses that found a trend; Predicted counts
	// pages proposed.
	Predictions, Predicted atomic.Uint64
}

// NewLeap returns a predictor; hits reports cumulative prefetch hits.
func NewLeap(hits func() uint64) *Leap { return &Leap{hits: hits, depth: 4} }

// Miss records a host miss on page (a page number or key) and appends the
// pages to prefetch to out.
func (l *Leap) Miss(page uint64, out []uint64) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		l.hist[l.pos] = int64(page - l.last)
		l.pos = (l.pos + 1) % len(l.hist)
		l.n = min(l.n+1, len(l.hist))
	}
	l.last, l.started = page, true
	delta, ok := l.trend()
	if !ok {
		return out
	}
	h := l.hits()
	recent := h - l.lastHit
	l.lastHit = h
	d := 4
	for d < int(recent)+2 {
		d <<= 1
	}
	d = min(max(d, 4, l.depth/2), 8)
	l.depth = d
	l.Predictions.Add(1)
	for i := 1; i <= d; i++ {
		out = append(out, page+uint64(int64(i)*delta))
	}
	l.Predicted.Add(uint64(d))
	return out
}

// trend finds a majority delta in the most recent 8, 16 or 32 deltas.
func (l *Leap) trend() (int64, bool) {
	for _, w := range [...]int{8, 16, 32} {
		if l.n < w {
			return 0, false
		}
		var cand int64
		count := 0
		for i := 1; i <= w; i++ {
			d := l.hist[(l.pos-i+len(l.hist))%len(l.hist)]
			switch {
			case count == 0:
				cand, count = d, 1
			case d == cand:
				count++
			default:
				count--
			}
		}
		// Boyer–Moore gives a candidate; confirm it is a true majority.
		occ := 0
		for i := 1; i <= w; i++ {
			if l.hist[(l.pos-i+len(l.hist))%len(l.hist)] == cand {
				occ++
			}
		}
		if occ > w/2 && cand != 0 {
			return cand, true
		}
	}
	return 0, false
}

// LeapRemote runs Leap on the host's misses and prefetches through an
// Engine into the Loading Zone; reads and write-backs go to the Engine.
//
// Every read capability of the Engine is forwarded by a method of its
// own that first shows the miss to Leap: with the Engine embedded, the
// page store's capability checks found the Engine's ReadPages and
// ReadPageAsync, and NBD reads and multi-page misses never reached the
// predictor.
type LeapRemote struct {
	Engine *Engine
	L      *Leap
}

var (
	_ pagestore.Remote           = LeapRemote{}
	_ pagestore.PagesReader      = LeapRemote{}
	_ pagestore.StreamReader     = LeapRemote{}
	_ pagestore.AsyncReader      = LeapRemote{}
	_ pagestore.AsyncPagesReader = LeapRemote{}
	_ pagestore.Trimmer          = LeapRemote{}
)

// missed shows Leap a run of n missed pages from first and prefetches what
// it predicts after the last of them.
func (r LeapRemote) missed(first pageid.Key, n int) {
	var buf [8]uint64
	var out []uint64
	for i := range n {
		out = r.L.Miss(uint64(first)+uint64(i), buf[:0])
	}
	for _, p := range out {
		pk := pageid.Key(p)
		if pk.Volume() == first.Volume() { // never run off into another volume
			r.Engine.Prefetch(pk)
		}
	}
}

// ReadPage implements pagestore.Remote.
func (r LeapRemote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	r.missed(k, 1)
	return r.Engine.ReadPage(ctx, k, dst)
}

// ReadPages implements pagestore.PagesReader.
func (r LeapRemote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	r.missed(first, len(p)/pageid.Size)
	return r.Engine.ReadPages(ctx, first, p)
}

// ReadStreamPages implements pagestore.StreamReader.
func (r LeapRemote) ReadStreamPages(ctx context.Context, first pageid.Key, p []byte) error {
	r.missed(first, len(p)/pageid.Size)
	return r.Engine.ReadStreamPages(ctx, first, p)
}

// StreamTook implements pagestore.StreamReader.
func (r LeapRemote) StreamTook(k pageid.Key) { r.Engine.StreamTook(k) }

// ReadPageAsync implements pagestore.AsyncReader.
func (r LeapRemote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	r.missed(k, 1)
	r.Engine.ReadPageAsync(k, dst, done)
}

// ReadPagesAsync implements pagestore.AsyncPagesReader.
func (r LeapRemote) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.missed(first, len(p)/pageid.Size)
	r.Engine.ReadPagesAsync(first, p, done)
}

// WritePages implements pagestore.Remote.
func (r LeapRemote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	return r.Engine.WritePages(ctx, keys, pages)
}

// Map implements pagestore.Mapper.
func (r LeapRemote) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	return r.Engine.Map(ctx, vol, off, n, fn)
}

// Trim implements pagestore.Trimmer.
func (r LeapRemote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return r.Engine.Trim(ctx, vol, off, n)
}

package pagestore

import (
	"container/list"
	"math/rand/v2"
	"testing"

	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lru is the baseline the policies are measured against (simulation only).
type lru struct {
	l     *list.List
	elems map[int32]*list.Element
}

func newLRU() *lru { return &lru{l: list.New(), elems: make(map[int32]*list.Element)} }

func (p *lru) hit(f int32)                  { p.l.MoveToFront(p.elems[f]) }
func (p *lru) insert(f int32, _ pageid.Key) { p.elems[f] = p.l.PushFront(f) }
func (p *lru) size() int                    { return p.l.Len() }
func (p *lru) victim(claim func(int32) bool, tries int) int32 {
	failed := 0
	for e := p.l.Back(); e != nil; e = e.Prev() {
		f := e.Value.(int32)
		if claim(f) {
			p.l.Remove(e)
			delete(p.elems, f)
			return f
		}
		if failed++; failed == tries {
			return -1
		}
	}
	return -1
}

// simulate replays accesses of dist over n pages through a cache of frames
// frames managed by pol and returns the hit ratio after a warm-up.
func simulate(pol policy, frames int, dist workload.Dist, accesses int, seed uint64) float64 {
	r := rand.New(rand.NewPCG(seed, 7))
	where := make(map[uint64]int32, frames)
	keyOf := make([]uint64, frames)
	next := int32(0)
	always := func(int32) bool { return true }
	hits, total := 0, 0
	for i := 0; i < 2*accesses; i++ {
		k := dist.Next(r)
		counted := i >= accesses
		if counted {
			total++
		}
		if f, ok := where[k]; ok {
			pol.hit(f)
			if counted {
				hits++
			}
			continue
		}
		var f int32
		if int(next) < frames {
			f = next
			next++
		} else {
			f = pol.victim(always, 0)
			delete(where, keyOf[f])
		}
		where[k] = f
		keyOf[f] = k
		pol.insert(f, pageid.Key(k))
	}
	return float64(hits) / float64(total)
}

func TestPoliciesEvictSomething(t *testing.T) {
	for _, name := range PolicyNames {
		pol, err := newPolicy(name, 64)
		assert.NoError(t, err)
		h := simulate(pol, 64, workload.NewZipf(1024, 0.99), 20000, 1)
		assert.Greater(t, h, 0.2, name)
		assert.Equal(t, 64, pol.size())
	}
	_, err := newPolicy("fifo", 4)
	assert.Error(t, err)
}

// A caller that must not wait bounds the frames a policy offers it: with
// every frame refused, victim gives up after tries claims (and keeps
// every frame); without a bound it goes on.
func TestVictimGivesUpAfterTriesRefusals(t *testing.T) {
	const frames = 64
	for _, name := range append([]string{"lru"}, PolicyNames...) {
		for _, tc := range []struct {
			tries   int
			atLeast int // claims asked for
			atMost  int
		}{
			{tries: 8, atLeast: 8, atMost: 8},
			{tries: 32, atLeast: 32, atMost: 32},
			{tries: 0, atLeast: frames, atMost: 4 * frames},
		} {
			var pol policy = newLRU()
			if name != "lru" {
				var err error
				pol, err = newPolicy(name, frames)
				require.NoError(t, err)
			}
			for f := range int32(frames) {
				pol.insert(f, pageid.Key(f))
			}
			asked := 0
			got := pol.victim(func(int32) bool { asked++; return false }, tc.tries)
			assert.Equal(t, int32(-1), got, "%s tries=%d", name, tc.tries)
			assert.GreaterOrEqual(t, asked, tc.atLeast, "%s tries=%d", name, tc.tries)
			assert.LessOrEqual(t, asked, tc.atMost, "%s tries=%d", name, tc.tries)
			assert.Equal(t, frames, pol.size(), "%s tries=%d: refused frames stay candidates", name, tc.tries)
			f := pol.victim(func(int32) bool { return true }, tc.tries)
			assert.GreaterOrEqual(t, f, int32(0), "%s tries=%d: a frame that can be claimed is found after a refusal", name, tc.tries)
		}
	}
}

// BenchmarkPolicyHitRatio measures hit ratios of LRU, CLOCK and S3-FIFO on
// the page benchmark's shape: 1 GiB of pages, a 64 MiB cache (6.25%).
// Run with -benchtime=1x; the metric is hit%, not time.
func BenchmarkPolicyHitRatio(b *testing.B) {
	const pages, frames, accesses = 262144, 16384, 2_000_000
	dists := []workload.Dist{workload.Uniform{N: pages}, workload.NewZipf(pages, 0.99), workload.NewZipf(pages, 0.8)}
	for _, d := range dists {
		for _, name := range []string{"lru", "clock", "s3fifo"} {
			b.Run(d.String()+"/"+name, func(b *testing.B) {
				var h float64
				for i := 0; i < b.N; i++ {
					var pol policy = newLRU()
					if name != "lru" {
						pol, _ = newPolicy(name, frames)
					}
					h = simulate(pol, frames, d, accesses, 42)
				}
				b.ReportMetric(100*h, "hit%")
			})
		}
	}
}

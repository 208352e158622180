package hostview

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestModel: random adds, deletes and lookups against a map, near full
// load; any disagreement beyond the fingerprint false-positive rate fails.
func TestModel(t *testing.T) {
	for _, shards := range []int{1, 2, 4} {
		rng := rand.New(rand.NewPCG(testutil.Seed(t), uint64(shards)))
		const capacity = 20000
		s := New(capacity, shards)
		model := map[uint64]bool{}
		universe := make([]uint64, 40000)
		for i := range universe {
			universe[i] = rng.Uint64() | 1
		}
		fp := 0
		for step := 0; step < 300000; step++ {
			k := universe[rng.IntN(len(universe))]
			switch rng.IntN(3) {
			case 0:
				if len(model) < capacity {
					assert.Equal(t, !model[k], s.Add(k))
					model[k] = true
				}
			case 1:
				assert.Equal(t, model[k], s.Delete(k), "delete %x", k)
				delete(model, k)
			default:
				got := s.Contains(k)
				if model[k] {
					require.True(t, got, "false negative for %x at step %d", k, step)
				} else if got {
					fp++
				}
			}
		}
		assert.Equal(t, len(model), s.Len())
		assert.Zero(t, s.Dropped())
		assert.LessOrEqual(t, fp, 1, "false positives beyond the fingerprint rate")
		require.NoError(t, s.Check())
		keys := make([]uint64, 0, 1000)
		for i := 0; i < 1000; i++ {
			keys = append(keys, universe[rng.IntN(len(universe))])
		}
		out := make([]bool, len(keys))
		s.ContainsBatch(keys, out)
		for i, k := range keys {
			assert.Equal(t, s.Contains(k), out[i], "batch and single lookup disagree on %x", k)
		}
	}
}

// TestFillsToCapacity: the table accepts its capacity without losses.
func TestFillsToCapacity(t *testing.T) {
	s := New(100000, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	added := make([]uint64, 0, 100000)
	for len(added) < 100000 {
		k := rng.Uint64() | 1
		if s.Add(k) {
			added = append(added, k)
		}
	}
	assert.Zero(t, s.Dropped())
	for _, k := range added {
		require.True(t, s.Contains(k))
	}
	assert.Less(t, float64(s.Bytes())/100000, 6.0, "bytes per key")
	require.NoError(t, s.Check())
}

func TestConcurrent(t *testing.T) {
	s := New(50000, 2)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each goroutine owns keys ≡ g mod 4.
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			mine := map[uint64]bool{}
			keys := make([]uint64, 64)
			out := make([]bool, 64)
			for i := 0; i < 20000; i++ {
				k := uint64(rng.IntN(10000))*4 + uint64(g) + 4
				if rng.IntN(2) == 0 {
					s.Add(k)
					mine[k] = true
				} else {
					s.Delete(k)
					delete(mine, k)
				}
				if i%100 == 0 {
					j := 0
					for mk := range mine {
						if j == len(keys) {
							break
						}
						keys[j] = mk
						j++
					}
					s.ContainsBatch(keys[:j], out[:j])
					for x := 0; x < j; x++ {
						if !out[x] {
							t.Errorf("lost key %d", keys[x])
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, s.Check())
}

func TestLadderStagesAgree(t *testing.T) {
	s := New(5000, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 3000)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		if i%2 == 0 {
			s.Add(keys[i])
		}
	}
	want := make([]bool, len(keys))
	s.ContainsBatch(keys, want)
	for st := Basic; st <= Delayed; st++ {
		got := make([]bool, len(keys))
		s.LookupStage(st, keys, got)
		assert.Equal(t, want, got, st.String())
	}
	for i := range keys {
		assert.Equal(t, i%2 == 0, want[i])
	}
}

func BenchmarkContainsBatch(b *testing.B) {
	const n = 1 << 20
	s := New(n, 1)
	rng := rand.New(rand.NewPCG(1, 1))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		s.Add(keys[i])
	}
	out := make([]bool, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := (i * 64) % (n - 64)
		s.ContainsBatch(keys[o:o+64], out)
	}
	b.ReportMetric(float64(b.N)*64/b.Elapsed().Seconds()/1e6, "Mlookups/s")
}

// TestOverfullRefusesQuickly: adds past the load limit fail at once and
// count as dropped instead of kicking forever.
func TestOverfullRefusesQuickly(t *testing.T) {
	s := New(1000, 1)
	rng := rand.New(rand.NewPCG(3, 3))
	for i := 0; i < 100000; i++ {
		s.Add(rng.Uint64() | 1)
	}
	assert.Positive(t, s.Dropped())
	assert.LessOrEqual(t, s.Len(), s.shards[0].full())
	require.NoError(t, s.Check())
}

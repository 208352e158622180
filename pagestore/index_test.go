package pagestore

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// TestIndexAgreesWithAMap drives the index and a Go map with the same
// random adds and removes, over few keys so that runs collide, wrap past
// the table's end and are cut by removals, and over many so that it grows.
func TestIndexAgreesWithAMap(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keys, ops int
		hint      int
	}{
		{"few keys, small table", 12, 20000, 1},
		{"wide keys, growing", 5000, 40000, 8},
		{"sized for its keys", 300, 20000, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.keys), 9))
			x := newIndex(tc.hint)
			want := map[pageid.Key]int32{}
			keyOf := func() pageid.Key { return pageid.Key(r.Uint64N(uint64(tc.keys)) * 0x10001) }
			for i := range tc.ops {
				k := keyOf()
				f := int32(r.IntN(1000))
				switch r.IntN(3) {
				case 0, 1:
					_, had := want[k]
					require.Equal(t, !had, x.add(k, f), "op %d: add %v", i, k)
					if !had {
						want[k] = f
					}
				case 2:
					g, had := want[k]
					if had && r.IntN(4) > 0 {
						f = g // mostly remove what is there
					}
					require.Equal(t, had && g == f, x.remove(k, f), "op %d: remove %v→%d", i, k, f)
					if had && g == f {
						delete(want, k)
					}
				}
				require.Equal(t, len(want), x.len())
				if i%97 == 0 {
					for k := range tc.keys {
						g, ok := x.get(pageid.Key(uint64(k) * 0x10001))
						w, wok := want[pageid.Key(uint64(k)*0x10001)]
						require.Equal(t, wok, ok, "op %d: key %d present", i, k)
						require.Equal(t, w, g, "op %d: key %d's frame", i, k)
					}
				}
			}
			got := map[pageid.Key]int32{}
			for k, f := range x.all() {
				got[k] = f
			}
			require.Equal(t, want, got)
			require.LessOrEqual(t, x.len()*4, len(x.slots)*3, "kept under three quarters full")
		})
	}
}

// BenchmarkIndexRandom looks up, removes and adds random keys in a table
// of a 64 MiB cache's shard share, beside a Go map doing the same.
func BenchmarkIndexRandom(b *testing.B) {
	const n = 16384
	keys := make([]pageid.Key, 4*n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		keys[i] = pageid.Key(r.Uint64N(1 << 18))
	}
	b.Run("index", func(b *testing.B) {
		x := newIndex(2 * n)
		for i := range n {
			x.add(keys[i], int32(i))
		}
		b.ResetTimer()
		for i := range b.N {
			k, old := keys[(i+n)%len(keys)], keys[i%len(keys)]
			if _, ok := x.get(k); !ok {
				if f, ok := x.get(old); ok {
					x.remove(old, f)
				}
				x.add(k, int32(i))
			}
		}
	})
	b.Run("map", func(b *testing.B) {
		m := make(map[pageid.Key]int32, 2*n)
		for i := range n {
			m[keys[i]] = int32(i)
		}
		b.ResetTimer()
		for i := range b.N {
			k, old := keys[(i+n)%len(keys)], keys[i%len(keys)]
			if _, ok := m[k]; !ok {
				delete(m, old)
				m[k] = int32(i)
			}
		}
	})
}

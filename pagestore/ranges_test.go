package pagestore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRangesModel: random unaligned reads, writes and zeroings of a volume
// through an 8-page cache, against a flat byte-slice model.
func TestRangesModel(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testutil.Seed(t), 5))
			rem := NewMemRemote()
			const pages = 64
			s := newTestStore(t, rem, 8, pol, pages)
			ctx := context.Background()
			model := make([]byte, pages*PageSize)
			for i := 0; i < 3000; i++ {
				off := rng.Uint64N(uint64(len(model)))
				n := 1 + rng.Uint64N(min(uint64(len(model))-off, 3*PageSize))
				switch rng.IntN(6) {
				case 0, 1:
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					require.NoError(t, s.WriteRange(ctx, 1, off, p))
					copy(model[off:], p)
				case 2:
					require.NoError(t, s.ZeroRange(ctx, 1, off, n, rng.IntN(2) == 0))
					clear(model[off : off+n])
				case 3:
					require.NoError(t, s.Flush(ctx))
				default:
					p := make([]byte, n)
					require.NoError(t, s.ReadRange(ctx, 1, off, p))
					if !bytes.Equal(model[off:off+n], p) {
						t.Fatalf("step %d: read %d bytes at %d differs from the model", i, n, off)
					}
				}
			}
			require.NoError(t, s.Flush(ctx))
			all := make([]byte, len(model))
			require.NoError(t, s.ReadRange(ctx, 1, 0, all))
			assert.True(t, bytes.Equal(model, all))
			assert.Positive(t, s.discards.Load(), "whole pages were trimmed")
			assert.ErrorIs(t, s.ReadRange(ctx, 1, uint64(len(model))-1, make([]byte, 2)), ErrOutOfRange)
			assert.ErrorIs(t, s.WriteRange(ctx, 2, 0, make([]byte, 2)), ErrNoVolume)
		})
	}
}

package dpu

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bigVolume is the size of a file's volume in the trims below: a TRIM
// request carries at most 4 GiB, a file's range may be far larger.
const bigVolume = 8 << 30

// TestTrimOfManyGiB: a trim longer than one TRIM request (a file of more
// than 4 GiB truncated) frees the whole range, on one node and on a
// replicated volume placed as a filesystem's (one extent for the file),
// and the Loading Zone forgets the pages it held there.
func TestTrimOfManyGiB(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(t *testing.T) *rig
	}{
		{"node", func(t *testing.T) *rig {
			c, vol := sizedNode(t, context.Background(), bigVolume)
			return engineRig(t, c, vol, 64)
		}},
		{"replicated", func(t *testing.T) *rig {
			s := cluster.Stripes{Epoch: 1, ExtentBytes: bigVolume, Replicas: 2, Extents: [][]string{{"a", "b"}}}
			v := replica.Volume{ID: 9, Name: "v", Size: bigVolume, Stripes: s, Local: map[string]uint16{}}
			clients := map[string]*memnode.Client{}
			for _, id := range []string{"a", "b"} {
				c, local := sizedNode(t, context.Background(), bigVolume)
				clients[id], v.Local[id] = c, local.ID
			}
			rem, err := replica.New(clients, []replica.Volume{v}, nil)
			require.NoError(t, err)
			return engineRigOn(t, rem, pageid.VolumeInfo{ID: v.ID, Name: v.Name, Size: v.Size}, 64)
		}},
	} {
		// 5 GiB: more pages than the zone has records (one pass over
		// them); 32 pages: fewer (looked up one by one).
		for _, trimmed := range []uint64{5 << 30, 32 * pageid.Size} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, trimmed), func(t *testing.T) {
				trimOfManyGiB(t, tc.new(t), trimmed)
			})
		}
	}
}

func trimOfManyGiB(t *testing.T, r *rig, trimmed uint64) {
	ctx := context.Background()
	first := pageid.MakeKey(r.vol.ID, 0)
	last := pageid.MakeKey(r.vol.ID, trimmed/pageid.Size-1)
	kept := pageid.MakeKey(r.vol.ID, trimmed/pageid.Size)
	keys := []pageid.Key{first, last, kept}
	require.NoError(t, r.e.WritePages(ctx, keys, [][]byte{versioned(1), versioned(2), versioned(3)}))
	for _, k := range keys {
		r.e.Prefetch(k)
	}
	require.Eventually(t, func() bool { return r.e.Placed.Load() >= uint64(len(keys)) }, 5*time.Second, time.Millisecond)

	require.NoError(t, r.e.Trim(ctx, r.vol.ID, 0, trimmed))
	got := make([]byte, pageid.Size)
	assert.Zero(t, r.lz.CheckAndReturn(uint64(first), got), "the Loading Zone kept a trimmed page")
	assert.Zero(t, r.lz.CheckAndReturn(uint64(last), got), "the Loading Zone kept a trimmed page")
	assert.Equal(t, pageid.Size, r.lz.CheckAndReturn(uint64(kept), got), "the Loading Zone lost a page after the range")
	require.NoError(t, r.e.ReadPage(ctx, last, got))
	assert.Equal(t, make([]byte, pageid.Size), got, "the last page trimmed still holds data")
	require.NoError(t, r.e.ReadPage(ctx, kept, got))
	assert.Equal(t, versioned(3), got, "the page after the range was trimmed")
}

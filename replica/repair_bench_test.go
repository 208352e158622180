package replica

import (
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/require"
)

// BenchmarkRepairExtent copies a full 16 MiB extent to a new node, in
// process (the control plane's changes in memory): the copy's own cost,
// without etcd's transactions.
func BenchmarkRepairExtent(b *testing.B) {
	const extentPages = 4096
	r := newRig(b, 2*extentPages, extentPages, 5*time.Second, nil)
	rem := r.remote(b)
	ctx := context.Background()
	buf := make([]byte, memnode.ChunkSize)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := uint64(0); off < extentPages*pageid.Size; off += memnode.ChunkSize {
		for _, id := range []string{"a", "b"} {
			require.NoError(b, r.clients[id].WriteAt(ctx, r.vol.Local[id], off, buf))
		}
	}
	b.SetBytes(extentPages * pageid.Size)
	for i := 0; b.Loop(); i++ {
		require.NoError(b, rem.Repair(ctx, 7, 0, "c", r.clients["c"], nil))
		require.NoError(b, rem.dropReplica(ctx, rem.vols[7].Load(), 0, "c"))
	}
}

package ec

import (
	"context"
	"testing"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/pageid"
)

// One page written at a time (the page cache's write-back of an evicted
// dirty page): the row's reads, then its writes.
func BenchmarkWritePage4K(b *testing.B) {
	r := newRig(b, cluster.Scheme{K: 4, M: 2}, 6, 8*extent)
	rem := r.remote(b)
	page := make([]byte, pageid.Size)
	ctx := context.Background()
	b.SetBytes(pageid.Size)
	for i := 0; b.Loop(); i++ {
		if err := rem.WriteAt(ctx, r.vol.ID, uint64(i%2048)*pageid.Size, page); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadPage4K(b *testing.B) {
	r := newRig(b, cluster.Scheme{K: 4, M: 2}, 6, 8*extent)
	rem := r.remote(b)
	page := make([]byte, pageid.Size)
	ctx := context.Background()
	b.SetBytes(pageid.Size)
	for i := 0; b.Loop(); i++ {
		if err := rem.ReadPage(ctx, pageid.MakeKey(r.vol.ID, uint64(i%2048)), page); err != nil {
			b.Fatal(err)
		}
	}
}

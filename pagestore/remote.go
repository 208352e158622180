package pagestore

import (
	"context"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// MemnodeRemote reads and writes pages directly on a memory node: one READ
// per miss, write-backs pipelined on the client's connection.
type MemnodeRemote struct {
	C *memnode.Client
}

var _ Remote = MemnodeRemote{}

// ReadPage implements Remote.
func (r MemnodeRemote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	return r.C.ReadAt(ctx, k.Volume(), k.Page()*pageid.Size, dst)
}

// WritePages implements Remote: all writes are sent before any is awaited,
// so a batch costs about one round trip.
func (r MemnodeRemote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	var calls [flushBatch]memnode.Call
	var failed pageid.Failures
	total := len(keys)
	for len(keys) > 0 {
		n := min(len(keys), len(calls))
		for i := 0; i < n; i++ {
			calls[i] = r.C.WriteAsync(ctx, keys[i].Volume(), keys[i].Page()*pageid.Size, pages[i])
		}
		for i := 0; i < n; i++ {
			if err := calls[i].Wait(ctx); err != nil {
				failed.Add(keys[i], err)
			}
		}
		keys, pages = keys[n:], pages[n:]
	}
	return failed.Err("writing", total)
}

// Trim implements Trimmer.
func (r MemnodeRemote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return r.C.Trim(ctx, vol, off, n)
}

var _ Trimmer = MemnodeRemote{}

// ReadPages implements PagesReader: one READ for the whole run.
func (r MemnodeRemote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	return r.C.ReadAt(ctx, first.Volume(), first.Page()*pageid.Size, p)
}

var _ PagesReader = MemnodeRemote{}

package memnode

import (
	"context"
	"errors"

	"github.com/pd3-go/pd3/pageid"
)

// Remote reads and writes pages directly on a memory node, as the page
// store's Remote (pagestore.Remote, with its Trimmer, PagesReader and
// AsyncReader capabilities): one READ per miss, write-backs pipelined on
// the client's connection.
type Remote struct {
	C *Client
}

// writeBatch is how many write-backs are in flight before the first is
// awaited.
const writeBatch = 64

// ReadPage implements pagestore.Remote.
func (r Remote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	return r.C.ReadAt(ctx, k.Volume(), k.Page()*pageid.Size, dst)
}

// WritePages implements pagestore.Remote: all writes are sent before any is awaited,
// so a batch costs about one round trip.
func (r Remote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	var calls [writeBatch]Call
	var failed pageid.Failures
	total := len(keys)
	for len(keys) > 0 {
		n := min(len(keys), len(calls))
		// The batch leaves in one write (pipeline.Cork).
		cork := r.C.Cork()
		cork.Hold()
		for i := 0; i < n; i++ {
			calls[i] = r.C.WriteAsync(ctx, keys[i].Volume(), keys[i].Page()*pageid.Size, pages[i])
		}
		cork.Release()
		for i := 0; i < n; i++ {
			if err := calls[i].Wait(ctx); err != nil {
				failed.Add(keys[i], err)
			}
		}
		keys, pages = keys[n:], pages[n:]
	}
	return failed.Err("writing", total)
}

// Trim implements pagestore.Trimmer.
func (r Remote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return r.C.Trim(ctx, vol, off, n)
}

// Map implements pagestore.Mapper at the node's grain (chunks). A node
// that predates MAP makes every run data.
func (r Remote) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	at := off
	err := r.C.Allocated(ctx, vol, off, n, func(o, m uint64, held bool) { fn(o, m, !held); at = o + m })
	if errors.Is(err, ErrUnknownOp) && at == off {
		fn(off, n, false)
		return nil
	}
	return err
}

// ReadPages implements pagestore.PagesReader: one READ for the whole run.
func (r Remote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	return r.C.ReadAt(ctx, first.Volume(), first.Page()*pageid.Size, p)
}

// ReadPageAsync implements pagestore.AsyncReader.
func (r Remote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	r.C.ReadFn(k.Volume(), k.Page()*pageid.Size, dst, done)
}

// ReadPagesAsync implements pagestore.AsyncPagesReader: one READ.
func (r Remote) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.C.ReadFn(first.Volume(), first.Page()*pageid.Size, p, done)
}

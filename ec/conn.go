package ec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// This file is the rest of what a host asks of its volumes' remote: the
// batched writes and trims of the page cache's write-back, and dpu.Conn,
// the agent engine's contract (one-copy reads without failing over, and
// writes it orders its prefetches after).

// writeWorkers bounds the runs of one WritePages coded at once: each is a
// round trip to one node and then to 1+M. As many as a flush writes back
// at once (pagestore's batch of 64 pages): a node then takes several
// requests a wake-up, their frames coalesced by its session's writer,
// instead of one each (docs/decisions.md, 28).
const writeWorkers = 64

// ReadAt reads p at byte off of volume vol, decoding what it must
// (dpu.Conn).
func (r *Remote) ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	if off%pageid.Size != 0 {
		return fmt.Errorf("ec: read at %d: %w", off, memnode.ErrBadRequest)
	}
	return r.ReadPages(ctx, pageid.MakeKey(vol, off/pageid.Size), p)
}

// WritePages implements pagestore.Remote: consecutive pages are written
// as one run of their shard, and runs of different rows side by side.
func (r *Remote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writeWorkers)
	var errs error
	var mu sync.Mutex
	for i := 0; i < len(order); {
		first := keys[order[i]]
		n := 1
		for i+n < len(order) && keys[order[i+n]] == first+pageid.Key(n) && n < maxRunBytes/pageid.Size &&
			(first.Page()+uint64(n))*pageid.Size%maxRunBytes != 0 {
			n++
		}
		run := order[i : i+n]
		i += n
		g.Go(func() error {
			buf := r.bufs.Get().(*[]byte)
			defer r.bufs.Put(buf)
			b := (*buf)[:len(run)*pageid.Size]
			for j, o := range run {
				copy(b[j*pageid.Size:], pages[o][:pageid.Size])
			}
			if err := r.WriteAt(gctx, first.Volume(), first.Page()*pageid.Size, b); err != nil {
				mu.Lock()
				errs = errors.Join(errs, fmt.Errorf("pages %v+%d: %w", first, len(run), err))
				mu.Unlock()
			}
			return nil
		})
	}
	g.Wait()
	return errs
}

// WriteQueued is WritePages calling queued once the pages are at their
// nodes (dpu.Conn): a write of a coded row is reads and then writes, so
// it is not queued before it is done.
func (r *Remote) WriteQueued(ctx context.Context, keys []pageid.Key, pages [][]byte, queued func()) error {
	err := r.WritePages(ctx, keys, pages)
	if queued != nil {
		queued()
	}
	return err
}

// Trim implements pagestore.Trimmer: the range reads as zeroes. Each run
// is coded as a write of zeroes, the data shard's bytes trimmed at its
// node and parity that comes out all zeroes trimmed too; then every
// memory-node chunk of a shard the trim left all zeroes is trimmed whole,
// which frees its memory.
func (r *Remote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	if off+n > v.Size {
		return fmt.Errorf("ec: trim of %d bytes at %d past volume %q: %w", n, off, v.Name, pageid.ErrOutOfRange)
	}
	p := v.p.Load()
	// chunk is a memory-node chunk of data shard s being trimmed, and
	// the same chunk of the group's other shards: which stayed zero over
	// each run of it so far.
	type chunk struct {
		g, s int
		o    uint64 // chunk-aligned offset in the shards
		zero uint64 // bit x: shard x stayed zero
		runs int
	}
	var cur *chunk
	finish := func() error {
		if cur == nil || cur.runs != memnode.ChunkSize/maxRunBytes {
			return nil
		}
		for x := range p.Shards() {
			node, local, _ := r.node(v, v.p.Load(), cur.g, x)
			if cur.zero&(1<<x) == 0 || node == nil {
				continue
			}
			if err := node.Trim(ctx, local, p.NodeOffset(cur.g, x, cur.o), memnode.ChunkSize); err != nil && !memnode.NodeFault(ctx, err) {
				return err
			}
		}
		return nil
	}
	err = runs(p, off, n, func(g, s int, o, _, m uint64) error {
		zero, err := r.update(ctx, v, g, s, o, int(m), nil)
		if err != nil {
			return err
		}
		co := o - o%memnode.ChunkSize
		if cur == nil || cur.g != g || cur.s != s || cur.o != co {
			if err := finish(); err != nil {
				return err
			}
			cur = &chunk{g: g, s: s, o: co, zero: zero}
		} else {
			cur.zero &= zero
		}
		if m == maxRunBytes {
			cur.runs++
		}
		return nil
	})
	if err != nil {
		return err
	}
	return finish()
}

// TrimQueued is Trim calling queued once it is done (dpu.Conn).
func (r *Remote) TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error {
	err := r.Trim(ctx, vol, off, n)
	if queued != nil {
		queued()
	}
	return err
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Span is how many of the n pages from first one read carries: a read
// from one node ends where its shard does (dpu.Conn).
func (r *Remote) Span(first pageid.Key, n int) int {
	v, err := r.volume(first.Volume())
	if err != nil {
		return 1
	}
	eb := v.p.Load().ExtentBytes
	left := (eb - first.Page()*pageid.Size%eb) / pageid.Size
	return max(1, int(min(uint64(n), left)))
}

// oneNode is the live node holding p at byte off of vol, and where in its
// volume, for a read from one node: an error where there is none (the
// caller reads with ReadAt, which decodes).
func (r *Remote) oneNode(vol uint16, off uint64, n int) (Node, uint16, uint64, error) {
	v, err := r.volume(vol)
	if err != nil {
		return nil, 0, 0, err
	}
	p := v.p.Load()
	g, s, o := p.Locate(off)
	if off+uint64(n) > v.Size || o+uint64(n) > p.ExtentBytes {
		return nil, 0, 0, fmt.Errorf("ec: %d bytes at %d of volume %q: not within one shard", n, off, v.Name)
	}
	node, local, id := r.node(v, p, g, s)
	if node == nil || r.suspect(id) {
		return nil, 0, 0, fmt.Errorf("ec: volume %q group %d shard %d: %w", v.Name, g, s, pageid.ErrUnavailable)
	}
	return node, local, p.NodeOffset(g, s, o), nil
}

// ReadOneFn reads from the one node holding the bytes, without decoding
// (dpu.Conn); done is called as by memnode.Client.ReadFn.
func (r *Remote) ReadOneFn(vol uint16, off uint64, p []byte, done func(error)) {
	n, local, at, err := r.oneNode(vol, off, len(p))
	if err != nil {
		done(err)
		return
	}
	n.ReadFn(local, at, p, done)
}

// PrefetchFn is ReadOneFn of page k (dpu.Conn).
func (r *Remote) PrefetchFn(k pageid.Key, page []byte, done func(error)) {
	r.ReadOneFn(k.Volume(), k.Page()*pageid.Size, page[:pageid.Size], done)
}

// ReadAsync starts a read from the one node holding the bytes (dpu.Conn).
func (r *Remote) ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call {
	n, local, at, err := r.oneNode(vol, off, len(p))
	if err != nil {
		return memnode.DoneCall(err)
	}
	return n.ReadAsync(ctx, local, at, p)
}

// ReadFn is ReadAt without blocking (dpu.Conn): done is called from the
// node's connection reader, or from a goroutine of its own when the read
// must decode (rare: done must not hold up a connection reader for the
// round trips of a decode).
func (r *Remote) ReadFn(vol uint16, off uint64, p []byte, done func(error)) {
	n, local, at, err := r.oneNode(vol, off, len(p))
	if err != nil {
		go func() { done(r.ReadAt(context.Background(), vol, off, p)) }()
		return
	}
	a := r.reads.Get().(*asyncRead)
	a.vol, a.off, a.p, a.done = vol, off, p, done
	n.ReadFn(local, at, p, a.fn)
}

// ReadPageAsync is pagestore's AsyncReader, with ReadFn: a host's
// cache answers a miss from the node's connection reader (a degraded read
// decodes on a goroutine of its own).
func (r *Remote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	r.ReadFn(k.Volume(), k.Page()*pageid.Size, dst[:pageid.Size], done)
}

// ReadPagesAsync is pagestore's AsyncPagesReader, with ReadFn.
func (r *Remote) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.ReadFn(first.Volume(), first.Page()*pageid.Size, p, done)
}

// asyncRead is a ReadFn in flight; fn is its finish method, bound once,
// so a read allocates nothing.
type asyncRead struct {
	r    *Remote
	vol  uint16
	off  uint64
	p    []byte
	done func(error)
	fn   func(error)
}

func (a *asyncRead) finish(err error) {
	r, vol, off, p, done := a.r, a.vol, a.off, a.p, a.done
	a.p, a.done = nil, nil
	r.reads.Put(a)
	if err == nil || !memnode.NodeFault(context.Background(), err) {
		done(err)
		return
	}
	go func() { done(r.ReadAt(context.Background(), vol, off, p)) }()
}

// Fence presents token for volume vol at every node holding one of its
// shards; a node that cannot be reached has its shards dropped, since a
// superseded writer might still reach it.
func (r *Remote) Fence(ctx context.Context, vol uint16, token uint64) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	v.token.Store(token)
	for _, id := range v.p.Load().Nodes() {
		n, local, reach := r.nodeByID(v, id)
		if reach {
			err = n.Fence(ctx, local, token)
			if err == nil {
				continue
			}
			if !memnode.NodeFault(ctx, err) {
				return fmt.Errorf("ec: volume %q node %s: %w", v.Name, id, err)
			}
		} else {
			err = fmt.Errorf("node %s: %w", id, pageid.ErrUnavailable)
		}
		p := v.p.Load()
		for g, row := range p.Groups {
			for s, at := range row {
				if at != id {
					continue
				}
				if derr := r.drop(ctx, v, g, s); derr != nil {
					return fmt.Errorf("ec: volume %q: node %s cannot be fenced (%v) nor its shards dropped: %w", v.Name, id, err, derr)
				}
			}
		}
	}
	return nil
}

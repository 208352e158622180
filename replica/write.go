package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// The write path: each page or range to every replica of its extent,
// extents locked in a fixed order, and the replicas that failed dropped
// through the control plane before the write returns.

// op is one request to one replica of a write.
type op struct {
	item int // index of the page or range it serves
	v    *volume
	ext  int
	n    *node
	call memnode.Call
	err  error // set instead of call when it could not be sent
}

// writeBatch bounds the pages of a WritePages sent before the first wait.
const writeBatch = 64

// extentRef names one extent of one volume.
type extentRef struct {
	v *volume
	e int
}

// held is the extents whose locks a write holds shared, each once (a
// second RLock of a lock a repair waits for would never be granted),
// taken in ascending order.
type held []extentRef

func (h *held) add(v *volume, e int) {
	if !slices.Contains(*h, extentRef{v, e}) {
		*h = append(*h, extentRef{v, e})
	}
}

func (h held) lock() {
	slices.SortFunc(h, func(a, b extentRef) int {
		if a.v != b.v {
			return int(a.v.ID) - int(b.v.ID)
		}
		return a.e - b.e
	})
	for _, x := range h {
		if x.e < len(x.v.locks) {
			x.v.locks[x.e].RLock()
		}
	}
}

func (h held) unlock() {
	for _, x := range h {
		if x.e < len(x.v.locks) {
			x.v.locks[x.e].RUnlock()
		}
	}
}

// WritePages implements pagestore.Remote: each page to every replica of
// its extent (and every node joining it), a batch at a time, each sent
// whole before any of it is awaited.
func (r *Remote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	var errs error
	for len(keys) > 0 {
		n := min(len(keys), writeBatch)
		errs = errors.Join(errs, r.WriteQueued(ctx, keys[:n], pages[:n], nil))
		keys, pages = keys[n:], pages[n:]
	}
	return errs
}

// WriteQueued writes pages[i] as keys[i] to every replica of its extent
// and every node joining it, calling queued (if set) once every request
// is sent, before any is awaited (dpu.Conn): a read sent after that, to
// whichever replica, reads these pages.
func (r *Remote) WriteQueued(ctx context.Context, keys []pageid.Key, pages [][]byte, queued func()) error {
	ops := make([]op, 0, len(keys)*2)
	var locks held
	var early error
	for _, k := range keys {
		if v, err := r.volume(k.Volume()); err == nil {
			locks.add(v, v.p.stripes.Load().Extent(k.Page()*pageid.Size))
		}
	}
	locks.lock()
	// The batch's requests for one node leave in one write (decision 48).
	cork := r.cork()
	cork.Hold()
	for i, k := range keys {
		v, err := r.volume(k.Volume())
		if err != nil {
			early = errors.Join(early, err)
			continue
		}
		off := k.Page() * pageid.Size
		page := pages[i]
		ops = r.issue(ops, i, v, off, func(c *memnode.Client, local uint16) memnode.Call {
			return c.WriteAsync(ctx, local, off, page)
		})
	}
	cork.Release()
	if queued != nil {
		queued()
	}
	err := r.settle(ctx, ops, len(keys), func(i int) string { return fmt.Sprintf("page %v", keys[i]) })
	locks.unlock()
	return errors.Join(early, err)
}

// Trim implements pagestore.Trimmer: at every replica of every extent the
// range touches.
func (r *Remote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return r.TrimQueued(ctx, vol, off, n, nil)
}

// TrimQueued is Trim calling queued, as WriteQueued does.
func (r *Remote) TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error {
	return r.ranged(ctx, vol, off, n, memnode.MaxTrim, "trim", queued, func(c *memnode.Client, local uint16, at, m uint64) memnode.Call {
		return c.TrimAsync(ctx, local, at, m)
	})
}

// WriteAt writes p at byte off of volume vol, at every replica of each
// extent it touches: the bytes of a range that is not whole pages (a
// filesystem's metadata).
func (r *Remote) WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return r.ranged(ctx, vol, off, uint64(len(p)), uint64(len(p)), "write", nil, func(c *memnode.Client, local uint16, at, m uint64) memnode.Call {
		return c.WriteAsync(ctx, local, at, p[at-off:at-off+m])
	})
}

// ranged sends n bytes at off of vol, cut at extents and into pieces of
// at most most bytes (what one request carries), to every node that takes
// writes of each (send makes one request), calls queued once all are
// sent, and settles them.
func (r *Remote) ranged(ctx context.Context, vol uint16, off, n, most uint64, what string, queued func(), send func(c *memnode.Client, local uint16, at, m uint64) memnode.Call) error {
	v, err := r.volume(vol)
	if err != nil {
		if queued != nil {
			queued()
		}
		return err
	}
	s := v.p.stripes.Load()
	var locks held
	for at := off; at < off+n; at += s.ExtentBytes - at%s.ExtentBytes {
		locks.add(v, s.Extent(at))
	}
	locks.lock()
	defer locks.unlock()
	var ops []op
	items := 0
	for n > 0 {
		m := min(n, s.ExtentBytes-off%s.ExtentBytes, most)
		at := off
		ops = r.issue(ops, items, v, at, func(c *memnode.Client, local uint16) memnode.Call { return send(c, local, at, m) })
		items++
		off, n = off+m, n-m
	}
	if queued != nil {
		queued()
	}
	return r.settle(ctx, ops, items, func(int) string { return fmt.Sprintf("%s of volume %q", what, v.Name) })
}

// issue sends one request to each node that must take a write to the
// extent holding off; a node this host does not reach is a failed op.
func (r *Remote) issue(ops []op, item int, v *volume, off uint64, send func(*memnode.Client, uint16) memnode.Call) []op {
	s := v.p.stripes.Load()
	e := s.Extent(off)
	if e >= len(s.Extents) {
		return append(ops, op{item: item, v: v, ext: e, err: fmt.Errorf("byte %d past volume %q: %w", off, v.Name, pageid.ErrOutOfRange)})
	}
	if len(s.Extents[e]) == 0 {
		return append(ops, op{item: item, v: v, ext: e, err: fmt.Errorf("volume %q extent %d: %w", v.Name, e, ErrLost)})
	}
	nodes := *r.nodes.Load()
	for _, id := range s.Writers(e) {
		n, reach := nodes[id]
		local, has := v.localID(id)
		if !reach || !has {
			ops = append(ops, op{item: item, v: v, ext: e, n: &node{id: id}, err: fmt.Errorf("node %s: %w", id, pageid.ErrUnavailable)})
			continue
		}
		ops = append(ops, op{item: item, v: v, ext: e, n: n, call: send(n.c, local)})
	}
	return ops
}

// settle waits for ops serving items items. An item is done when one
// replica took it and every node that failed is off the map (a joining
// node counts for nothing but must be dropped too); it fails when no
// replica took it, when a failure was the request's (fenced), or when a
// failed node could not be dropped.
func (r *Remote) settle(ctx context.Context, ops []op, items int, what func(int) string) error {
	took := make([]bool, items)
	var errs error
	type key struct {
		extentRef
		node string
	}
	var failed []key
	var failErr []error
	for i := range ops {
		o := &ops[i] // o.n nil: the request failed before any replica
		err := o.err
		if err == nil {
			err = o.call.Wait(ctx)
		}
		if err == nil {
			if slices.Contains(o.v.p.stripes.Load().Extents[o.ext], o.n.id) {
				took[o.item] = true
			}
			continue
		}
		if o.n == nil || (o.err == nil && !replicaFault(ctx, err)) {
			errs = errors.Join(errs, fmt.Errorf("%s: %w", what(o.item), err))
			continue
		}
		if o.n.c != nil {
			o.n.failedAt.Store(r.now().UnixNano())
		}
		k := key{extentRef{o.v, o.ext}, o.n.id}
		if !slices.Contains(failed, k) {
			failed = append(failed, k)
			failErr = append(failErr, err)
		}
	}
	for i, t := range took {
		if !t && errs == nil {
			errs = fmt.Errorf("%s: no replica took it: %w", what(i), errors.Join(failErr...))
		}
	}
	if errs != nil {
		return errs
	}
	for i, f := range failed {
		if err := r.dropReplica(ctx, f.v, f.e, f.node); err != nil {
			return fmt.Errorf("volume %q extent %d: replica at node %s failed (%w) and could not be dropped: %w",
				f.v.Name, f.e, f.node, failErr[i], err)
		}
	}
	return nil
}

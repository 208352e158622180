package replica

import (
	"context"
	"fmt"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// The read path: a READ at the first live replica of each extent it
// touches, failing over to the next; the non-blocking forms the page
// store and the agent use; and Map of a volume's data and holes.

// ReadPage implements pagestore.Remote.
func (r *Remote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	return r.ReadPages(ctx, k, dst)
}

// ReadPages implements pagestore.PagesReader: one READ per extent the run
// touches.
func (r *Remote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	return r.ReadAt(ctx, first.Volume(), first.Page()*pageid.Size, p)
}

// ReadAt reads p at byte off of volume vol: one READ per extent it
// touches, each failing over between the extent's replicas.
func (r *Remote) ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	s := v.p.stripes.Load()
	for len(p) > 0 {
		n := min(uint64(len(p)), s.ExtentBytes-off%s.ExtentBytes)
		if err := r.readExtent(ctx, v, s, off, p[:n]); err != nil {
			return err
		}
		off, p = off+n, p[n:]
	}
	return nil
}

// firstCopy is the replica of extent e a read goes to first, and its id
// of v's copy.
func (r *Remote) firstCopy(v *volume, s *cluster.Stripes, e int) (*node, uint16, error) {
	if e >= len(s.Extents) {
		return nil, 0, fmt.Errorf("replica: extent %d past volume %q: %w", e, v.Name, pageid.ErrOutOfRange)
	}
	var buf [maxReplicas]*node
	for _, n := range r.replicas(s, e, &buf) {
		if local, ok := v.localID(n.id); ok {
			return n, local, nil
		}
	}
	return nil, 0, fmt.Errorf("replica: volume %q extent %d: %w", v.Name, e, ErrLost)
}

// oneCopy is where a read of n bytes at off of vol that does not fail
// over goes: the extent's first replica, if the read stays in one extent.
func (r *Remote) oneCopy(vol uint16, off uint64, n int) (*volume, *node, uint16, error) {
	v, err := r.volume(vol)
	if err != nil {
		return nil, nil, 0, err
	}
	s := v.p.stripes.Load()
	e := s.Extent(off)
	if n > 0 && s.Extent(off+uint64(n)-1) != e {
		return v, nil, 0, fmt.Errorf("replica: %d bytes at %d of volume %q span two extents", n, off, v.Name)
	}
	nd, local, err := r.firstCopy(v, s, e)
	return v, nd, local, err
}

// Span is how many of the n pages from first lie in first's extent: what
// ReadAsync reads with one request.
func (r *Remote) Span(first pageid.Key, n int) int {
	v, err := r.volume(first.Volume())
	if err != nil {
		return n
	}
	eb := v.p.stripes.Load().ExtentBytes
	left := (eb - first.Page()*pageid.Size%eb) / pageid.Size
	return int(min(uint64(n), left))
}

// ReadAsync starts reading p at byte off of volume vol from one replica,
// without failing over (dpu.Conn: a prefetch that fails costs only
// itself). A read spanning two extents is refused: read it with ReadAt.
func (r *Remote) ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call {
	_, n, local, err := r.oneCopy(vol, off, len(p))
	if err != nil {
		return memnode.DoneCall(err)
	}
	return n.c.ReadAsync(ctx, local, off, p)
}

// PrefetchFn reads page k from one replica as a prefetch (memnode
// OpPrefetch), without failing over (dpu.Conn); done is called as by
// memnode.Client.PrefetchFn.
func (r *Remote) PrefetchFn(k pageid.Key, page []byte, done func(error)) {
	_, n, local, err := r.oneCopy(k.Volume(), k.Page()*pageid.Size, pageid.Size)
	if err != nil {
		done(err)
		return
	}
	n.c.PrefetchFn(pageid.MakeKey(local, k.Page()), page, done)
}

// ReadOneFn is ReadAsync with a completion function (dpu.Conn): one
// replica, no failing over.
func (r *Remote) ReadOneFn(vol uint16, off uint64, p []byte, done func(error)) {
	_, n, local, err := r.oneCopy(vol, off, len(p))
	if err != nil {
		done(err)
		return
	}
	n.c.ReadFn(local, off, p, done)
}

// ReadFn is ReadAt without blocking: done is called once, from the
// replica's connection reader, or from a goroutine of its own when the
// first replica fails and the read goes on to another (rare: done must
// not hold up a connection reader for a second round trip).
func (r *Remote) ReadFn(vol uint16, off uint64, p []byte, done func(error)) {
	v, n, local, err := r.oneCopy(vol, off, len(p))
	if err != nil {
		if v == nil {
			done(err)
			return
		}
		go func() { done(r.ReadAt(context.Background(), vol, off, p)) }()
		return
	}
	a := r.reads.Get().(*asyncRead)
	a.v, a.n, a.off, a.p, a.done = v, n, off, p, done
	n.inflight.Add(1)
	n.c.ReadFn(local, off, p, a.fn)
}

// ReadPageAsync implements pagestore.AsyncReader with ReadFn, so that a
// host's cache answers a miss from the replica's connection reader, as it
// does over one node, instead of a goroutine that waits for it.
func (r *Remote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	r.ReadFn(k.Volume(), k.Page()*pageid.Size, dst[:pageid.Size], done)
}

// ReadPagesAsync implements pagestore.AsyncPagesReader with ReadFn: one
// READ when the run stays in one extent.
func (r *Remote) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.ReadFn(first.Volume(), first.Page()*pageid.Size, p, done)
}

// asyncRead is a ReadFn in flight; fn is its finish method, bound once,
// so a read allocates nothing.
type asyncRead struct {
	r    *Remote
	v    *volume
	n    *node
	off  uint64
	p    []byte
	done func(error)
	fn   func(error)
}

func (a *asyncRead) finish(err error) {
	r, v, n, off, p, done := a.r, a.v, a.n, a.off, a.p, a.done
	a.v, a.n, a.p, a.done = nil, nil, nil, nil
	r.reads.Put(a)
	n.inflight.Add(-1)
	if err == nil || !replicaFault(context.Background(), err) {
		done(err)
		return
	}
	n.failedAt.Store(r.now().UnixNano())
	r.Failovers.Add(1)
	go func() { done(r.ReadAt(context.Background(), v.ID, off, p)) }()
}

func (r *Remote) readExtent(ctx context.Context, v *volume, s *cluster.Stripes, off uint64, p []byte) error {
	e := s.Extent(off)
	if e >= len(s.Extents) {
		return fmt.Errorf("replica: %d bytes at %d past volume %q: %w", len(p), off, v.Name, pageid.ErrOutOfRange)
	}
	return r.atOneReplica(ctx, v, s, e, func(n *node, local uint16) error {
		n.inflight.Add(1)
		defer n.inflight.Add(-1)
		return n.c.ReadAt(ctx, local, off, p)
	})
}

// atOneReplica runs try at the replicas of extent e this host reaches,
// best first, until one answers: a replica's fault (replicaFault) moves on
// to the next and counts a failover, any other error is the caller's.
func (r *Remote) atOneReplica(ctx context.Context, v *volume, s *cluster.Stripes, e int, try func(n *node, local uint16) error) error {
	var buf [maxReplicas]*node
	var last error
	for i, n := range r.replicas(s, e, &buf) {
		local, ok := v.localID(n.id)
		if !ok {
			continue
		}
		if i > 0 {
			r.Failovers.Add(1)
		}
		err := try(n, local)
		if err == nil {
			return nil
		}
		if !replicaFault(ctx, err) {
			return err
		}
		n.failedAt.Store(r.now().UnixNano())
		last = fmt.Errorf("node %s: %w", n.id, err)
	}
	if last == nil {
		return fmt.Errorf("volume %q extent %d: %w", v.Name, e, ErrLost)
	}
	return fmt.Errorf("volume %q extent %d: every replica failed: %w", v.Name, e, last)
}

// Map implements pagestore.Mapper: each extent as one of its replicas
// stores it (the first that answers, as a read would choose), adjacent
// runs of the same kind joined.
func (r *Remote) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	runs := pageid.Runs{Emit: fn}
	s := v.p.stripes.Load()
	for end := off + n; off < end; {
		m := min(end-off, s.ExtentBytes-off%s.ExtentBytes)
		if err := r.mapExtent(ctx, v, s, off, m, runs.Add); err != nil {
			return err
		}
		off += m
	}
	runs.Flush()
	return nil
}

// mapExtent maps n bytes at off, within one extent, at the first replica
// that answers. Runs are handed on only once a whole answer is in: a
// replica failing halfway leaves nothing half-reported.
func (r *Remote) mapExtent(ctx context.Context, v *volume, s *cluster.Stripes, off, n uint64, fn func(off, n uint64, hole bool)) error {
	e := s.Extent(off)
	if e >= len(s.Extents) {
		return fmt.Errorf("replica: %d bytes at %d past volume %q: %w", n, off, v.Name, pageid.ErrOutOfRange)
	}
	type run struct {
		off, n uint64
		hole   bool
	}
	var runs []run
	err := r.atOneReplica(ctx, v, s, e, func(nd *node, local uint16) error {
		runs = runs[:0]
		return memnode.Remote{C: nd.c}.Map(ctx, local, off, n, func(o, m uint64, hole bool) { runs = append(runs, run{o, m, hole}) })
	})
	if err != nil {
		return err
	}
	for _, x := range runs {
		fn(x.off, x.n, x.hole)
	}
	return nil
}

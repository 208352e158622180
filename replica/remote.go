package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Errors callers branch on.
var (
	// ErrLost: no replica of the extent is left (every node that held it
	// failed); its pages read as an error, never as zeroes.
	ErrLost = errors.New("replica: every replica of the extent is lost")
	// ErrUnknownVolume: the key names a volume this Remote does not serve.
	ErrUnknownVolume = errors.New("replica: volume not served here")
)

// Dropper takes a replica that missed a write off the volume's stripe map
// (durably: cluster.DropReplica) and returns the new map.
//
// Absent (Options.Dropper nil): a replica that misses a write fails the
// write, which the pagestore retries and then reports as EIO.
type Dropper interface {
	DropReplica(ctx context.Context, volume string, extent int, node string) (cluster.Stripes, error)
}

// Volume is a replicated volume as a host serves it.
type Volume struct {
	ID      uint16 // in page keys: the cluster's id of the volume
	Name    string // the name of its copy at every node
	Size    uint64
	Stripes cluster.Stripes
	// Local is each node's id of its copy; a node absent here (down when
	// the host started) is treated as a replica that failed.
	Local map[string]uint16
}

// Remote reads and writes replicated volumes. It is safe for concurrent
// use.
type Remote struct {
	nodes map[string]*node
	vols  map[uint16]*volume
	drop  Dropper
	now   func() time.Time

	// Failovers counts reads that went on to another replica; Dropped,
	// replicas taken off a map.
	Failovers, Dropped atomic.Uint64
}

type node struct {
	id       string
	c        *memnode.Client
	inflight atomic.Int64
	failedAt atomic.Int64 // UnixNano of the last failure, 0 if none
}

type volume struct {
	Volume
	stripes atomic.Pointer[cluster.Stripes]
	mu      sync.Mutex // serialises drops
}

// suspectFor is how long a node that failed is tried last.
const suspectFor = 5 * time.Second

// maxReplicas bounds R, so a request's replica list fits on the stack.
const maxReplicas = 8

// New returns a Remote over the memory nodes clients (by node id) serving
// vols. drop may be nil (see Dropper).
func New(clients map[string]*memnode.Client, vols []Volume, drop Dropper) (*Remote, error) {
	r := &Remote{nodes: make(map[string]*node), vols: make(map[uint16]*volume), drop: drop, now: time.Now}
	for id, c := range clients {
		r.nodes[id] = &node{id: id, c: c}
	}
	for _, v := range vols {
		if _, dup := r.vols[v.ID]; dup || v.ID == 0 {
			return nil, fmt.Errorf("replica: volume id %d of %q is 0 or taken", v.ID, v.Name)
		}
		if v.Stripes.ExtentBytes == 0 || v.Stripes.ExtentBytes%pageid.Size != 0 {
			return nil, fmt.Errorf("replica: volume %q: extent size %d", v.Name, v.Stripes.ExtentBytes)
		}
		for _, e := range v.Stripes.Extents {
			if len(e) > maxReplicas {
				return nil, fmt.Errorf("replica: volume %q: %d replicas, at most %d", v.Name, len(e), maxReplicas)
			}
		}
		vv := &volume{Volume: v}
		s := v.Stripes
		vv.stripes.Store(&s)
		r.vols[v.ID] = vv
	}
	return r, nil
}

// Stripes returns the current map of volume id.
func (r *Remote) Stripes(id uint16) (cluster.Stripes, bool) {
	v, ok := r.vols[id]
	if !ok {
		return cluster.Stripes{}, false
	}
	return *v.stripes.Load(), true
}

func (r *Remote) volume(vol uint16) (*volume, error) {
	v, ok := r.vols[vol]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownVolume, vol)
	}
	return v, nil
}

// replicaFault says whether err condemns the replica rather than the
// request: the node is unreachable, silent, or lost the volume. A fenced
// write (this host was superseded), a request the node finds malformed,
// or the caller giving up are the request's.
func replicaFault(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, memnode.ErrFenced), errors.Is(err, memnode.ErrOutOfRange),
		errors.Is(err, memnode.ErrTooLarge), errors.Is(err, memnode.ErrMisaligned),
		errors.Is(err, memnode.ErrBadRequest), errors.Is(err, memnode.ErrClosed):
		return false
	}
	return true
}

// replicas fills buf with the nodes of extent e that this host reaches,
// best first for a read: healthy before recently failed, then fewest
// requests outstanding.
func (r *Remote) replicas(s *cluster.Stripes, e int, buf *[maxReplicas]*node) []*node {
	out := buf[:0]
	for _, id := range s.Extents[e] {
		if n, ok := r.nodes[id]; ok {
			out = append(out, n)
		}
	}
	cutoff := r.now().Add(-suspectFor).UnixNano()
	suspect := func(n *node) bool { return n.failedAt.Load() > cutoff }
	slices.SortFunc(out, func(a, b *node) int {
		if sa, sb := suspect(a), suspect(b); sa != sb {
			if sa {
				return 1
			}
			return -1
		}
		return int(a.inflight.Load() - b.inflight.Load())
	})
	return out
}

// ReadPage implements pagestore.Remote.
func (r *Remote) ReadPage(ctx context.Context, k pagestore.Key, dst []byte) error {
	return r.ReadPages(ctx, k, dst)
}

// ReadPages implements pagestore.PagesReader: one READ per extent the run
// touches.
func (r *Remote) ReadPages(ctx context.Context, first pagestore.Key, p []byte) error {
	v, err := r.volume(first.Volume())
	if err != nil {
		return err
	}
	off := first.Page() * pageid.Size
	s := v.stripes.Load()
	for len(p) > 0 {
		n := min(uint64(len(p)), s.ExtentBytes-off%s.ExtentBytes)
		if err := r.readExtent(ctx, v, s, off, p[:n]); err != nil {
			return err
		}
		off, p = off+n, p[n:]
	}
	return nil
}

func (r *Remote) readExtent(ctx context.Context, v *volume, s *cluster.Stripes, off uint64, p []byte) error {
	e := s.Extent(off)
	if e >= len(s.Extents) {
		return fmt.Errorf("replica: %d bytes at %d past volume %q: %w", len(p), off, v.Name, memnode.ErrOutOfRange)
	}
	var buf [maxReplicas]*node
	var last error
	for i, n := range r.replicas(s, e, &buf) {
		local, ok := v.Local[n.id]
		if !ok {
			continue
		}
		if i > 0 {
			r.Failovers.Add(1)
		}
		n.inflight.Add(1)
		err := n.c.ReadAt(ctx, local, off, p)
		n.inflight.Add(-1)
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

// WritePages implements pagestore.Remote: each page to every replica of
// its extent, all sent before any is awaited.
func (r *Remote) WritePages(ctx context.Context, keys []pagestore.Key, pages [][]byte) error {
	var errs error
	ops := make([]op, 0, min(len(keys), writeBatch)*2)
	for len(keys) > 0 {
		n := min(len(keys), writeBatch)
		ops = ops[:0]
		var early error
		for i, k := range keys[:n] {
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
		errs = errors.Join(errs, early, r.settle(ctx, ops, n, func(i int) string { return fmt.Sprintf("page %v", keys[i]) }))
		keys, pages = keys[n:], pages[n:]
	}
	return errs
}

// Trim implements pagestore.Trimmer: at every replica of every extent the
// range touches.
func (r *Remote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	s := v.stripes.Load()
	var ops []op
	items := 0
	for n > 0 {
		m := min(n, s.ExtentBytes-off%s.ExtentBytes)
		at := off
		ops = r.issue(ops, items, v, at, func(c *memnode.Client, local uint16) memnode.Call {
			return c.TrimAsync(ctx, local, at, m)
		})
		items++
		off, n = off+m, n-m
	}
	return r.settle(ctx, ops, items, func(int) string { return fmt.Sprintf("trim of volume %q", v.Name) })
}

// issue sends one request per replica of the extent holding off; a
// replica this host does not reach is a failed op.
func (r *Remote) issue(ops []op, item int, v *volume, off uint64, send func(*memnode.Client, uint16) memnode.Call) []op {
	s := v.stripes.Load()
	e := s.Extent(off)
	if e >= len(s.Extents) {
		return append(ops, op{item: item, v: v, ext: e, err: fmt.Errorf("byte %d past volume %q: %w", off, v.Name, memnode.ErrOutOfRange)})
	}
	if len(s.Extents[e]) == 0 {
		return append(ops, op{item: item, v: v, ext: e, err: fmt.Errorf("volume %q extent %d: %w", v.Name, e, ErrLost)})
	}
	for _, id := range s.Extents[e] {
		n, reach := r.nodes[id]
		local, has := v.Local[id]
		if !reach || !has {
			ops = append(ops, op{item: item, v: v, ext: e, n: &node{id: id}, err: fmt.Errorf("node %s: %w", id, memnode.ErrConnLost)})
			continue
		}
		ops = append(ops, op{item: item, v: v, ext: e, n: n, call: send(n.c, local)})
	}
	return ops
}

// settle waits for ops serving items items. An item is done when one
// replica took it and every replica that failed is off the map; it fails
// when none took it, when a failure was the request's (fenced), or when
// a failed replica could not be dropped.
func (r *Remote) settle(ctx context.Context, ops []op, items int, what func(int) string) error {
	took := make([]bool, items)
	var errs error
	type key struct {
		v    *volume
		ext  int
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
			took[o.item] = true
			continue
		}
		if o.n == nil || (o.err == nil && !replicaFault(ctx, err)) {
			errs = errors.Join(errs, fmt.Errorf("%s: %w", what(o.item), err))
			continue
		}
		if o.n.c != nil {
			o.n.failedAt.Store(r.now().UnixNano())
		}
		k := key{o.v, o.ext, o.n.id}
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
		if err := r.dropReplica(ctx, f.v, f.ext, f.node); err != nil {
			return fmt.Errorf("volume %q extent %d: replica at node %s failed (%w) and could not be dropped: %w",
				f.v.Name, f.ext, f.node, failErr[i], err)
		}
	}
	return nil
}

// dropReplica takes node off extent e of v, through the Dropper, and
// installs the map it returns.
func (r *Remote) dropReplica(ctx context.Context, v *volume, e int, node string) error {
	if r.drop == nil {
		return errors.New("no control plane to drop it from the stripe map")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !slices.Contains(v.stripes.Load().Extents[e], node) {
		return nil
	}
	s, err := r.drop.DropReplica(ctx, v.Name, e, node)
	if err != nil {
		return err
	}
	if s.Epoch > v.stripes.Load().Epoch {
		v.stripes.Store(&s)
	}
	r.Dropped.Add(1)
	return nil
}

// DropNode takes node off every extent that lists it, in every volume:
// the control plane says it is down, and whatever it holds when (if) it
// returns may be stale or gone. An extent whose last replica it is keeps
// it (reads fail until the node is back, never read as zeroes); that is
// reported in the error, after the other extents are dropped.
func (r *Remote) DropNode(ctx context.Context, id string) error {
	var errs error
	for _, v := range r.vols {
		for e, reps := range v.stripes.Load().Extents {
			if !slices.Contains(reps, id) {
				continue
			}
			if err := r.dropReplica(ctx, v, e, id); err != nil {
				errs = errors.Join(errs, fmt.Errorf("volume %q extent %d: %w", v.Name, e, err))
			}
		}
	}
	return errs
}

// Fence presents token for volume vol at every node holding one of its
// extents; a node that cannot be reached has its replicas dropped, since
// a superseded writer might still reach it.
func (r *Remote) Fence(ctx context.Context, vol uint16, token uint64) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	for _, id := range v.stripes.Load().Nodes() {
		n, reach := r.nodes[id]
		local, has := v.Local[id]
		if reach && has {
			err = n.c.Fence(ctx, local, token)
			if err == nil || !replicaFault(ctx, err) {
				if err != nil {
					return fmt.Errorf("node %s: %w", id, err)
				}
				continue
			}
		}
		for e, reps := range v.stripes.Load().Extents {
			if slices.Contains(reps, id) {
				if derr := r.dropReplica(ctx, v, e, id); derr != nil {
					return fmt.Errorf("volume %q: node %s cannot be fenced (%v) nor dropped: %w", v.Name, id, err, derr)
				}
			}
		}
	}
	return nil
}

var (
	_ pagestore.Remote      = (*Remote)(nil)
	_ pagestore.PagesReader = (*Remote)(nil)
	_ pagestore.Trimmer     = (*Remote)(nil)
)

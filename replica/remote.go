package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
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
)

// Control changes a volume's stripe map durably (the control plane:
// cluster.DropReplica, AddJoining, Promote) and returns the new map.
//
// Absent (nil): a replica that misses a write fails the write, which the
// pagestore retries and then reports as EIO; Repair refuses to run.
type Control interface {
	// DropReplica takes node off extent, as a replica or a node joining.
	DropReplica(ctx context.Context, volume string, extent int, node string) (cluster.Stripes, error)
	// AddJoining lists node as joining extent: it takes the extent's
	// writes, and is not read.
	AddJoining(ctx context.Context, volume string, extent int, node string) (cluster.Stripes, error)
	// Promote makes a joining node a replica of extent.
	Promote(ctx context.Context, volume string, extent int, node string) (cluster.Stripes, error)
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
	mu    sync.Mutex // serialises changes of nodes and of the volume table
	nodes atomic.Pointer[map[string]*node]
	// vols is indexed by volume id: a lookup on the I/O path takes no
	// lock, and volumes come and go (a Group's files) without copying a
	// map.
	vols  []atomic.Pointer[volume]
	nfree uint16 // where the search for an id to hand out starts (below it, down)
	ctl   Control
	now   func() time.Time

	// copied, set by tests, runs in a repair between reading a chunk of
	// volume vol and writing it to the joining node: where a write must
	// not slip in.
	copied func(vol uint16)

	reads sync.Pool // *asyncRead

	// Failovers counts reads that went on to another replica; Dropped,
	// replicas taken off a map; Repaired, extents copied to a new
	// replica, and RepairBytes the bytes read for them (the chunks that
	// hold memory).
	Failovers, Dropped, Repaired, RepairBytes atomic.Uint64
}

type node struct {
	id       string
	c        *memnode.Client
	inflight atomic.Int64
	failedAt atomic.Int64 // UnixNano of the last failure, 0 if none
}

// placement is a stripe map and the control plane's record of it: a
// volume's own, or one a Group's volumes share.
type placement struct {
	record string     // the name the control plane keeps the map under
	mu     sync.Mutex // serialises changes of the map
	// The map changes (drops, repairs, moves): loaded whole, replaced
	// whole.
	stripes atomic.Pointer[cluster.Stripes]
}

func newPlacement(record string, s cluster.Stripes) *placement {
	p := &placement{record: record}
	s = s.Clone()
	p.stripes.Store(&s)
	return p
}

type volume struct {
	ID   uint16
	Name string
	Size uint64
	p    *placement
	// The node-local ids change (repairs, moves): loaded whole, replaced
	// whole under mu.
	local atomic.Pointer[map[string]uint16] // Volume.Local, copied on change
	token atomic.Uint64                     // the fencing token presented
	mu    sync.Mutex                        // serialises changes of local
	// locks order a repair's copy of a chunk after the writes to its
	// extent already sent: writes hold their extents' locks shared from
	// send to settle, a repair holds one exclusive while it reads a chunk
	// from a replica and writes it to the joining node.
	locks []sync.RWMutex
}

// setLocal records id as node's id of v's copy.
func (v *volume) setLocal(node string, id uint16) {
	v.mu.Lock()
	local := maps.Clone(*v.local.Load())
	local[node] = id
	v.local.Store(&local)
	v.mu.Unlock()
}

// localID is node's id of v's copy.
func (v *volume) localID(node string) (uint16, bool) {
	id, ok := (*v.local.Load())[node]
	return id, ok
}

// suspectFor is how long a node that failed is tried last.
const suspectFor = 5 * time.Second

// maxReplicas bounds R, so a request's replica list fits on the stack.
const maxReplicas = 8

// New returns a Remote over the memory nodes clients (by node id) serving
// vols. ctl may be nil (see Control).
func New(clients map[string]*memnode.Client, vols []Volume, ctl Control) (*Remote, error) {
	r := &Remote{vols: make([]atomic.Pointer[volume], 1<<16), nfree: 1<<16 - 1, ctl: ctl, now: time.Now}
	r.reads.New = func() any {
		a := &asyncRead{r: r}
		a.fn = a.finish
		return a
	}
	nodes := make(map[string]*node)
	for id, c := range clients {
		nodes[id] = &node{id: id, c: c}
	}
	r.nodes.Store(&nodes)
	for _, v := range vols {
		if v.ID == 0 || r.vols[v.ID].Load() != nil {
			return nil, fmt.Errorf("replica: volume id %d of %q is 0 or taken", v.ID, v.Name)
		}
		if err := checkStripes(v.Name, v.Stripes); err != nil {
			return nil, err
		}
		vv := &volume{ID: v.ID, Name: v.Name, Size: v.Size, p: newPlacement(v.Name, v.Stripes), locks: make([]sync.RWMutex, len(v.Stripes.Extents))}
		local := maps.Clone(v.Local)
		vv.local.Store(&local)
		r.vols[v.ID].Store(vv)
	}
	return r, nil
}

func checkStripes(name string, s cluster.Stripes) error {
	if s.ExtentBytes == 0 || s.ExtentBytes%pageid.Size != 0 {
		return fmt.Errorf("replica: volume %q: extent size %d", name, s.ExtentBytes)
	}
	for _, e := range s.Extents {
		if len(e) > maxReplicas {
			return fmt.Errorf("replica: volume %q: %d replicas, at most %d", name, len(e), maxReplicas)
		}
	}
	return nil
}

// add gives v a free id, the highest (the control plane hands ids out
// from 1 up, so New's volumes sit low), and serves it.
func (r *Remote) add(v *volume) (uint16, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for range len(r.vols) {
		id := r.nfree
		r.nfree--
		if r.nfree == 0 {
			r.nfree = 1<<16 - 1
		}
		if id != 0 && r.vols[id].Load() == nil {
			v.ID = id
			r.vols[id].Store(v)
			return id, nil
		}
	}
	return 0, fmt.Errorf("replica: %w: every volume id is taken", pageid.ErrNoMemory)
}

// remove stops serving v.
func (r *Remote) remove(v *volume) { r.vols[v.ID].CompareAndSwap(v, nil) }

// all is every volume served now.
func (r *Remote) all() []*volume {
	var out []*volume
	for i := range r.vols {
		if v := r.vols[i].Load(); v != nil {
			out = append(out, v)
		}
	}
	return out
}

// Stripes returns the current map of volume id.
func (r *Remote) Stripes(id uint16) (cluster.Stripes, bool) {
	v := r.vols[id].Load()
	if v == nil {
		return cluster.Stripes{}, false
	}
	return *v.p.stripes.Load(), true
}

func (r *Remote) volume(vol uint16) (*volume, error) {
	v := r.vols[vol].Load()
	if v == nil {
		return nil, fmt.Errorf("replica: volume %d: %w (not served here)", vol, pageid.ErrNoVolume)
	}
	return v, nil
}

// replicaFault says whether err condemns the replica rather than the
// request (memnode.NodeFault).
func replicaFault(ctx context.Context, err error) bool { return memnode.NodeFault(ctx, err) }

// replicas fills buf with the nodes of extent e that this host reaches,
// best first for a read: healthy before recently failed, then fewest
// requests outstanding.
func (r *Remote) replicas(s *cluster.Stripes, e int, buf *[maxReplicas]*node) []*node {
	out := buf[:0]
	nodes := *r.nodes.Load()
	for _, id := range s.Extents[e] {
		if n, ok := nodes[id]; ok {
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

// change runs a change of map p through the control plane and installs
// the map it returns, unless a newer one is there already.
func (r *Remote) change(p *placement, fn func(record string) (cluster.Stripes, error)) error {
	if r.ctl == nil {
		return errors.New("no control plane to change the stripe map")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := fn(p.record)
	if err != nil {
		return err
	}
	p.installLocked(s)
	return nil
}

// install makes s the map unless the one in use is as new.
func (p *placement) install(s cluster.Stripes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.installLocked(s)
}

// installLocked is install with mu held.
func (p *placement) installLocked(s cluster.Stripes) {
	if s.Epoch > p.stripes.Load().Epoch {
		s = s.Clone()
		p.stripes.Store(&s)
	}
}

// dropReplica takes node off extent e of v (a replica or a node joining).
func (r *Remote) dropReplica(ctx context.Context, v *volume, e int, node string) error {
	return r.drop(ctx, v.p, e, node)
}

// drop takes node off extent e of map p.
func (r *Remote) drop(ctx context.Context, p *placement, e int, node string) error {
	s := p.stripes.Load()
	if !slices.Contains(s.Writers(e), node) {
		return nil
	}
	err := r.change(p, func(rec string) (cluster.Stripes, error) { return r.ctl.DropReplica(ctx, rec, e, node) })
	if err == nil {
		r.Dropped.Add(1)
	}
	return err
}

// DropNode takes node off every extent that lists it, in every volume:
// the control plane says it is down, and whatever it holds when (if) it
// returns may be stale or gone. An extent whose last replica it is keeps
// it (reads fail until the node is back, never read as zeroes); that is
// reported in the error, after the other extents are dropped.
func (r *Remote) DropNode(ctx context.Context, id string) error {
	var errs error
	for _, v := range r.all() {
		for e := range v.p.stripes.Load().Extents {
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
	v.token.Store(token)
	nodes := *r.nodes.Load()
	for _, id := range v.p.stripes.Load().Nodes() {
		n, reach := nodes[id]
		local, has := v.localID(id)
		if reach && has {
			err = n.c.Fence(ctx, local, token)
			if err == nil || !replicaFault(ctx, err) {
				if err != nil {
					return fmt.Errorf("node %s: %w", id, err)
				}
				continue
			}
		}
		for e := range v.p.stripes.Load().Extents {
			if derr := r.dropReplica(ctx, v, e, id); derr != nil {
				return fmt.Errorf("volume %q: node %s cannot be fenced (%v) nor dropped: %w", v.Name, id, err, derr)
			}
		}
	}
	return nil
}

// Suspect reports whether node id failed a request lately: not a node
// to copy an extent to.
func (r *Remote) Suspect(id string) bool {
	n, ok := (*r.nodes.Load())[id]
	return ok && n.failedAt.Load() > r.now().Add(-suspectFor).UnixNano()
}

// AddNode lets the Remote reach memory node id through c (a node a repair
// copies to). A node it has already is kept. It returns the client the
// Remote writes to the node through: the one a fencing token must be
// presented on (the node fences each connection apart).
func (r *Remote) AddNode(id string, c *memnode.Client) *memnode.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := *r.nodes.Load()
	if n, ok := cur[id]; ok {
		return n.c
	}
	next := maps.Clone(cur)
	next[id] = &node{id: id, c: c}
	r.nodes.Store(&next)
	return c
}

// Degraded lists the extents of volume vol with fewer replicas than
// wanted and no node joining them.
func (r *Remote) Degraded(vol uint16) []int {
	v := r.vols[vol].Load()
	if v == nil {
		return nil
	}
	s := v.p.stripes.Load()
	var out []int
	for e, reps := range s.Extents {
		if len(reps) < s.Replicas && len(s.Writers(e)) == len(reps) {
			out = append(out, e)
		}
	}
	return out
}

// Repair copies extent e of volume vol to memory node target (reached
// through c) and makes it a replica. The node first gets the volume's
// copy, the volume's fencing token, and the extent's range cleared (it may
// hold stale bytes from an earlier life); then it joins the extent, so
// every write from then on reaches it; then each 1 MiB chunk is read from
// a replica and written to it under the extent's lock, which orders the
// copy after the writes already sent (chunks that hold no memory are not
// read, and chunks of zeroes are not written: the cleared range reads as
// zeroes, and a write since then is newer); then
// it is promoted. pace is called with the bytes of each chunk read, to
// throttle. A failure drops the node from the extent again.
func (r *Remote) Repair(ctx context.Context, vol uint16, e int, target string, c *memnode.Client, pace func(int)) (err error) {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	if r.ctl == nil {
		return errors.New("replica: repair needs the control plane")
	}
	s := v.p.stripes.Load()
	if e >= len(s.Extents) || slices.Contains(s.Writers(e), target) {
		return fmt.Errorf("replica: volume %q extent %d: no such extent, or node %s has it", v.Name, e, target)
	}
	// The token goes on the connection the host's writes take.
	c = r.AddNode(target, c)
	info, err := c.OpenOrCreate(ctx, v.Name, v.Size)
	if err != nil {
		return fmt.Errorf("replica: volume %q at node %s: %w", v.Name, target, err)
	}
	if info.Size < v.Size {
		// A copy left from before the volume grew (the node was down).
		if info, err = c.Resize(ctx, v.Name, v.Size); err != nil {
			return fmt.Errorf("replica: growing volume %q at node %s to %d bytes: %w", v.Name, target, v.Size, err)
		}
	}
	if tok := v.token.Load(); tok != 0 {
		if err := c.Fence(ctx, info.ID, tok); err != nil {
			return fmt.Errorf("replica: fencing volume %q at node %s: %w", v.Name, target, err)
		}
	}
	start := uint64(e) * s.ExtentBytes
	end := min(start+s.ExtentBytes, v.Size)
	if err := c.Trim(ctx, info.ID, start, end-start); err != nil {
		return fmt.Errorf("replica: clearing extent %d of volume %q at node %s: %w", e, v.Name, target, err)
	}
	v.setLocal(target, info.ID)
	if err := r.change(v.p, func(rec string) (cluster.Stripes, error) { return r.ctl.AddJoining(ctx, rec, e, target) }); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: %w", v.Name, e, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.dropReplica(context.WithoutCancel(ctx), v, e, target))
		}
	}()
	buf := make([]byte, memnode.ChunkSize)
	for off := start; off < end; off += memnode.ChunkSize {
		if err = r.copyChunk(ctx, v, e, c, info.ID, off, buf[:min(memnode.ChunkSize, end-off)], pace); err != nil {
			return fmt.Errorf("replica: copying extent %d of volume %q to node %s: %w", e, v.Name, target, err)
		}
	}
	if err = r.change(v.p, func(rec string) (cluster.Stripes, error) { return r.ctl.Promote(ctx, rec, e, target) }); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: %w", v.Name, e, err)
	}
	r.Repaired.Add(1)
	return nil
}

// copyChunk copies len(p) bytes at off of extent e of v from a replica
// to local, v's copy at a joining node reached through c, under the
// extent's lock: the copy is ordered after the writes already sent and
// before those not yet sent, which reach the joining node themselves.
// A chunk the replica stores no memory for (MAP) is not read, and one of
// zeroes is not written: the copy was cleared or made afresh. A volume no
// longer served (deleted) is skipped.
func (r *Remote) copyChunk(ctx context.Context, v *volume, e int, c *memnode.Client, local uint16, off uint64, p []byte, pace func(int)) error {
	v.locks[e].Lock()
	defer v.locks[e].Unlock()
	if r.vols[v.ID].Load() != v {
		return nil // deleted: gone at every node
	}
	s := v.p.stripes.Load()
	stored := false
	if err := r.mapExtent(ctx, v, s, off, uint64(len(p)), func(_, _ uint64, hole bool) { stored = stored || !hole }); err != nil {
		return err
	}
	if !stored {
		return nil // reads as zeroes, as the cleared copy does
	}
	if err := r.readExtent(ctx, v, s, off, p); err != nil {
		return err
	}
	if r.copied != nil {
		r.copied(v.ID)
	}
	if !zero(p) {
		if err := c.WriteAt(ctx, local, off, p); err != nil {
			return err
		}
	}
	r.RepairBytes.Add(uint64(len(p)))
	if pace != nil {
		pace(len(p))
	}
	return nil
}

// Install makes s volume vol's map if it is newer than the one in use:
// a change made elsewhere (an operator's moves), read from the control
// plane.
func (r *Remote) Install(vol uint16, s cluster.Stripes) {
	if v := r.vols[vol].Load(); v != nil && len(s.Extents) == len(v.locks) {
		v.p.install(s)
	}
}

// Move moves extent e of volume vol from node from to node to (reached
// through c): a repair onto to (unless it is a replica already), then
// from dropped, its copy of the extent trimmed, and its copy of the
// volume deleted once it holds no extent of it. What from holds is
// cleaned up on a best-effort basis: a node that cannot be reached is
// off the map all the same.
func (r *Remote) Move(ctx context.Context, vol uint16, e int, from, to string, c *memnode.Client, pace func(int)) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	s := v.p.stripes.Load()
	if e >= len(s.Extents) {
		return fmt.Errorf("replica: volume %q has no extent %d", v.Name, e)
	}
	if !slices.Contains(s.Extents[e], to) {
		if err := r.Repair(ctx, vol, e, to, c, pace); err != nil {
			return err
		}
	}
	if err := r.dropReplica(ctx, v, e, from); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: dropping node %s: %w", v.Name, e, from, err)
	}
	n, reach := (*r.nodes.Load())[from]
	local, has := v.localID(from)
	if !reach || !has {
		return nil
	}
	// Writes sent before the drop may still land: take the extent's lock
	// so that they are settled before the range is cleared.
	v.locks[e].Lock()
	start := uint64(e) * s.ExtentBytes
	n.c.Trim(ctx, local, start, min(s.ExtentBytes, v.Size-start))
	v.locks[e].Unlock()
	if !slices.Contains(v.p.stripes.Load().Nodes(), from) {
		n.c.DeleteFenced(ctx, v.Name, v.token.Load())
	}
	return nil
}

func zero(p []byte) bool {
	for len(p) >= 8 {
		if binary.LittleEndian.Uint64(p) != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

var (
	_ pagestore.Remote           = (*Remote)(nil)
	_ pagestore.PagesReader      = (*Remote)(nil)
	_ pagestore.AsyncReader      = (*Remote)(nil)
	_ pagestore.AsyncPagesReader = (*Remote)(nil)
	_ pagestore.Trimmer          = (*Remote)(nil)
)

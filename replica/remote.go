package replica

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/pipeline"
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

// cork is the cork the nodes' clients share (memnode.ClientOptions.Cork:
// the host's), or nil: a batch of requests holds it while it is sent.
func (r *Remote) cork() *pipeline.Cork {
	for _, n := range *r.nodes.Load() {
		if n.c != nil {
			return n.c.Cork()
		}
	}
	return nil
}

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

var (
	_ pagestore.Remote           = (*Remote)(nil)
	_ pagestore.PagesReader      = (*Remote)(nil)
	_ pagestore.AsyncReader      = (*Remote)(nil)
	_ pagestore.AsyncPagesReader = (*Remote)(nil)
	_ pagestore.Trimmer          = (*Remote)(nil)
)

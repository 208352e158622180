package ec

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// Node is what this package needs of a memory node (memnode.Client).
type Node interface {
	ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error
	WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error
	Trim(ctx context.Context, vol uint16, off, n uint64) error
	// ReadFn and ReadAsync read without blocking (the agent's engine).
	ReadFn(vol uint16, off uint64, p []byte, done func(error))
	ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call
	WriteAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call
	// XorAsync adds p to the bytes at off by exclusive or (a parity
	// shard taking a data shard's change).
	XorAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call
	TrimAsync(ctx context.Context, vol uint16, off, n uint64) memnode.Call
	Fence(ctx context.Context, vol uint16, token uint64) error
}

// Control records shards that missed a write, in the control plane, so
// that no host reads them again; it returns the placement as recorded.
type Control interface {
	DropShard(ctx context.Context, vol string, g, s int) (cluster.Coded, error)
	// SetShard records node as the holder of shard s of group g, once a
	// repair has rebuilt it there.
	SetShard(ctx context.Context, vol string, g, s int, node string) (cluster.Coded, error)
}

// Volume is an erasure-coded volume as a host serves it.
type Volume struct {
	ID        uint16 // the host's id of the volume (its page keys')
	Name      string
	Size      uint64
	Placement cluster.Coded
	// Local is each node's id of its volume of Name.
	Local map[string]uint16
}

// ErrLost: fewer than K shards of a row could be read, so its bytes are
// gone (or unreachable now); only the pages of that row fail.
var ErrLost = errors.New("ec: fewer than K shards of the row survive")

// Runs: a read or write moves at most maxRunBytes of one shard, and a
// run never crosses a multiple of it, so each run is under one lock (an
// extent is whole memory-node chunks, a multiple of it).
const (
	maxRunBytes = 64 * pageid.Size
	lockStripes = 4096
	// suspectFor is how long reads go around a node that failed, straight
	// to a decode from the other shards, before trying it again.
	suspectFor = time.Second
)

// Remote serves erasure-coded volumes: a pagestore.Remote (with
// PagesReader) over the memory nodes holding their shards.
//
// Reads go to the node holding the page's data shard; if it fails (down,
// silent past its client's op timeout, or answering pageid.ErrCorrupt)
// the row is decoded from K other shards, under the row's lock, and a
// corrupt shard is written back healed. Writes take the row's lock, read
// the row's other data shards (decoding any that cannot be read), encode
// the parity and write the data shard and the M parity shards; a shard
// that fails its write is dropped through Control before the write
// returns, so it is never read again. A write fails with ErrLost when
// fewer than K shards of a row would hold it.
//
// The host is the volume's only writer (it holds it in the control
// plane), so rows change only under this Remote's locks.
type Remote struct {
	mu    sync.Mutex                      // serialises changes of nodes
	nodes atomic.Pointer[map[string]Node] // copied on change (AddNode)
	vols  map[uint16]*volume
	ctl   Control
	seed  maphash.Seed
	locks [lockStripes]sync.Mutex
	now   func() time.Time
	bufs  sync.Pool // *[]byte of maxRunBytes
	rows  sync.Pool // *row
	reads sync.Pool // *asyncRead

	failedAt sync.Map // node id → time.Time of its last fault

	// Counters, for metrics.
	Decoded  atomic.Uint64 // runs read by decoding other shards
	Healed   atomic.Uint64 // corrupt shard runs rewritten from a decode
	Dropped  atomic.Uint64 // shards dropped after a failed write
	Repaired atomic.Uint64 // shards rebuilt on another node
	// RepairBytes counts the bytes repairs wrote (zero runs are skipped).
	RepairBytes atomic.Uint64
}

type volume struct {
	ID    uint16
	Name  string
	Size  uint64
	enc   reedsolomon.Encoder
	mu    sync.Mutex // serialises changes of p, local and joining
	p     atomic.Pointer[cluster.Coded]
	local atomic.Pointer[map[string]uint16] // Local, copied on change
	// joining is the shards a repair is rebuilding: writes to the rows it
	// has copied go to the new node too. A repair that finishes stores
	// the new placement before it leaves this list, so a write that
	// loads the list before the placement never misses the new node.
	joining atomic.Pointer[[]join]
	token   atomic.Uint64 // the fencing token presented (Fence); 0: none
	// redo holds the rows (rowKey) whose parity a failed delta write may
	// have left half changed: their next write recodes the whole row.
	redo sync.Map
}

// rowKey names the lock block of a row (Remote.lock's unit).
func rowKey(g int, o uint64) uint64 { return uint64(g)<<40 | o/maxRunBytes }

// join is a shard being rebuilt at node: rows below done are copied.
type join struct {
	g, s int
	node string
	done *atomic.Uint64
}

// New serves vols over nodes (a node missing from the map, or nil, is
// down: its shards are decoded). ctl records dropped shards.
func New(nodes map[string]Node, vols []Volume, ctl Control) (*Remote, error) {
	r := &Remote{vols: map[uint16]*volume{}, ctl: ctl, seed: maphash.MakeSeed(), now: time.Now}
	r.bufs.New = func() any { b := make([]byte, maxRunBytes); return &b }
	r.rows.New = func() any { return new(row) }
	r.reads.New = func() any { a := &asyncRead{r: r}; a.fn = a.finish; return a }
	live := map[string]Node{}
	for id, n := range nodes {
		if n != nil {
			live[id] = n
		}
	}
	r.nodes.Store(&live)
	for _, v := range vols {
		if err := v.Placement.Check(v.Size); err != nil {
			return nil, fmt.Errorf("ec: volume %q: %w", v.Name, err)
		}
		if _, ok := r.vols[v.ID]; ok {
			return nil, fmt.Errorf("ec: two volumes with id %d", v.ID)
		}
		enc, err := reedsolomon.New(v.Placement.K, v.Placement.M)
		if err != nil {
			return nil, fmt.Errorf("ec: volume %q: %w", v.Name, err)
		}
		vol := &volume{ID: v.ID, Name: v.Name, Size: v.Size, enc: enc}
		p := v.Placement.Clone()
		vol.p.Store(&p)
		local := maps.Clone(v.Local)
		vol.local.Store(&local)
		r.vols[v.ID] = vol
	}
	return r, nil
}

// Placement is volume id's placement as this host knows it.
func (r *Remote) Placement(id uint16) (cluster.Coded, bool) {
	v, ok := r.vols[id]
	if !ok {
		return cluster.Coded{}, false
	}
	return v.p.Load().Clone(), true
}

func (r *Remote) volume(id uint16) (*volume, error) {
	v, ok := r.vols[id]
	if !ok {
		return nil, fmt.Errorf("ec: volume %d: %w", id, pageid.ErrNoVolume)
	}
	return v, nil
}

// noteFault remembers a node's fault, unless it is one page's corruption
// (the node is well; the page is healed).
func (r *Remote) noteFault(id string, err error) {
	if !errors.Is(err, pageid.ErrCorrupt) {
		r.failedAt.Store(id, r.now())
	}
}

func (r *Remote) suspect(id string) bool {
	t, ok := r.failedAt.Load(id)
	return ok && r.now().Sub(t.(time.Time)) < suspectFor
}

// node is the live node holding shard s of group g, or nil.
func (r *Remote) node(v *volume, p *cluster.Coded, g, s int) (Node, uint16, string) {
	id := p.Groups[g][s]
	if id == "" {
		return nil, 0, ""
	}
	n, ok := (*r.nodes.Load())[id]
	local, has := (*v.local.Load())[id]
	if !ok || !has {
		return nil, 0, id
	}
	return n, local, id
}

func (r *Remote) lock(v *volume, g int, o uint64) *sync.Mutex {
	var h maphash.Hash
	h.SetSeed(r.seed)
	var b [16]byte
	b[0], b[1] = byte(v.ID), byte(v.ID>>8)
	u := rowKey(g, o)
	for i := range 8 {
		b[2+i] = byte(u >> (8 * i))
	}
	h.Write(b[:10])
	return &r.locks[h.Sum64()%lockStripes]
}

// runs calls fn for the pieces of the n bytes at off of v: each within
// one shard and one lock block.
func runs(p *cluster.Coded, off, n uint64, fn func(g, s int, o uint64, at, m uint64) error) error {
	for at := uint64(0); at < n; {
		g, s, o := p.Locate(off + at)
		m := min(n-at, maxRunBytes-o%maxRunBytes)
		if err := fn(g, s, o, at, m); err != nil {
			return err
		}
		at += m
	}
	return nil
}

// ReadPage implements pagestore.Remote.
func (r *Remote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	return r.ReadPages(ctx, k, dst[:pageid.Size])
}

// ReadPages implements pagestore.PagesReader.
func (r *Remote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	v, err := r.volume(first.Volume())
	if err != nil {
		return err
	}
	off := first.Page() * pageid.Size
	if off+uint64(len(p)) > v.Size {
		return fmt.Errorf("ec: %d bytes at %d past volume %q: %w", len(p), off, v.Name, pageid.ErrOutOfRange)
	}
	pl := v.p.Load()
	return runs(pl, off, uint64(len(p)), func(g, s int, o, at, m uint64) error {
		return r.readRun(ctx, v, g, s, o, p[at:at+m])
	})
}

// readRun reads one run of shard s at o from its node, or decodes it.
func (r *Remote) readRun(ctx context.Context, v *volume, g, s int, o uint64, buf []byte) error {
	p := v.p.Load()
	if n, local, id := r.node(v, p, g, s); n != nil && !r.suspect(id) {
		err := n.ReadAt(ctx, local, p.NodeOffset(g, s, o), buf)
		if err == nil || !memnode.NodeFault(ctx, err) {
			return err
		}
		r.noteFault(id, err)
	}
	mu := r.lock(v, g, o)
	mu.Lock()
	defer mu.Unlock()
	rw := r.row(v, len(buf))
	defer r.release(rw)
	if err := r.gather(ctx, v, g, o, rw); err != nil {
		return err
	}
	copy(buf, rw.shards[s])
	r.Decoded.Add(1)
	return nil
}

// row is one run of every shard of a group's row.
type row struct {
	shards [][]byte // len K+M, over arr
	// Per shard: answered pageid.ErrCorrupt (heal); could not be read
	// (lost, down or corrupt); the error and call of its request (one
	// request per shard at a time: reads, then writes).
	corrupt, failed [maxShards]bool
	errs            [maxShards]error
	calls           [maxShards]memnode.Call
	sent            [maxShards]bool
	arr             [maxShards][]byte
	bufs            [maxShards]*[]byte
}

// maxShards bounds a row (cluster.MaxData + cluster.MaxParity).
const maxShards = cluster.MaxData + cluster.MaxParity

// row takes a row of runs of n bytes from the pools; release gives it
// back: a coded write allocates nothing.
func (r *Remote) row(v *volume, n int) *row {
	k := v.p.Load().Shards()
	rw := r.rows.Get().(*row)
	rw.shards = rw.arr[:k]
	for i := range k {
		rw.bufs[i] = r.bufs.Get().(*[]byte)
		rw.shards[i] = (*rw.bufs[i])[:n]
	}
	return rw
}

func (r *Remote) release(rw *row) {
	for i := range rw.shards {
		r.bufs.Put(rw.bufs[i])
	}
	*rw = row{}
	r.rows.Put(rw)
}

// waitSent waits for every request of the row sent, into errs.
func (rw *row) waitSent(ctx context.Context) {
	for x := range rw.shards {
		if rw.sent[x] {
			rw.errs[x] = rw.calls[x].Wait(ctx)
			rw.sent[x], rw.calls[x] = false, memnode.Call{}
		}
	}
}

// gather fills row with the run at o of every shard of group g, reading
// those it can and decoding the rest; corrupt shards are
// written back healed. The row's lock is held.
func (r *Remote) gather(ctx context.Context, v *volume, g int, o uint64, rw *row) error {
	p := v.p.Load()
	// Nodes that failed lately are asked only when the others are too few.
	healthy := 0
	for s := range rw.shards {
		if n, _, id := r.node(v, p, g, s); p.Virtual(g, s) || (n != nil && !r.suspect(id)) {
			healthy++
		}
	}
	var wg sync.WaitGroup
	errs := rw.errs[:len(rw.shards)]
	clear(errs)
	for s := range rw.shards {
		if p.Virtual(g, s) {
			clear(rw.shards[s])
			continue
		}
		n, local, id := r.node(v, p, g, s)
		if n == nil || (healthy >= p.K && r.suspect(id)) {
			rw.failed[s] = true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.ReadAt(ctx, local, p.NodeOffset(g, s, o), rw.shards[s]); err != nil {
				errs[s] = err
				rw.failed[s] = true
				rw.corrupt[s] = errors.Is(err, pageid.ErrCorrupt)
				if memnode.NodeFault(ctx, err) {
					r.noteFault(id, err)
				}
			}
		}()
	}
	wg.Wait()
	missing := 0
	for s, err := range errs {
		if err != nil && !memnode.NodeFault(ctx, err) {
			return fmt.Errorf("ec: volume %q group %d shard %d: %w", v.Name, g, s, err)
		}
		if rw.failed[s] {
			missing++
		}
	}
	if missing == 0 {
		return nil
	}
	if missing > p.M {
		var why []string
		for s := range rw.shards {
			switch {
			case !rw.failed[s]:
			case errs[s] != nil:
				why = append(why, fmt.Sprintf("shard %d at %s: %v", s, p.Groups[g][s], errs[s]))
			case p.Groups[g][s] == "":
				why = append(why, fmt.Sprintf("shard %d lost", s))
			default:
				why = append(why, fmt.Sprintf("shard %d at %s: not reached", s, p.Groups[g][s]))
			}
		}
		return fmt.Errorf("ec: volume %q group %d at %d: %d of %d shards unreadable (%s): %w", v.Name, g, o, missing, p.Shards(), strings.Join(why, "; "), ErrLost)
	}
	for s := range rw.shards {
		if rw.failed[s] {
			rw.shards[s] = rw.shards[s][:0]
		}
	}
	if err := v.enc.Reconstruct(rw.shards); err != nil {
		return fmt.Errorf("ec: volume %q group %d: %w", v.Name, g, err)
	}
	for s := range rw.shards {
		if !rw.corrupt[s] {
			continue
		}
		if n, local, _ := r.node(v, p, g, s); n != nil && n.WriteAt(ctx, local, p.NodeOffset(g, s, o), rw.shards[s]) == nil {
			r.Healed.Add(1)
			rw.corrupt[s], rw.failed[s] = false, false
		}
	}
	return nil
}

// WriteAt writes p at byte off of volume vol, data and parity, and
// returns once every shard it changes holds it or was dropped.
func (r *Remote) WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	if off+uint64(len(p)) > v.Size {
		return fmt.Errorf("ec: %d bytes at %d past volume %q: %w", len(p), off, v.Name, pageid.ErrOutOfRange)
	}
	return runs(v.p.Load(), off, uint64(len(p)), func(g, s int, o, at, m uint64) error {
		return r.writeRun(ctx, v, g, s, o, p[at:at+m])
	})
}

// writeRun writes data as the run at o of data shard s of group g.
func (r *Remote) writeRun(ctx context.Context, v *volume, g, s int, o uint64, data []byte) error {
	_, err := r.update(ctx, v, g, s, o, len(data), data)
	return err
}

// update sets the n bytes at o of data shard s of group g to data (nil:
// zeroes, trimmed at the node): the row's other data shards are read (or
// decoded), the parity encoded, and the data shard and the parity shards
// written. With data nil a parity run that comes out all zeroes is
// trimmed too; zero has bit x set for each shard x now all zeroes there.
func (r *Remote) update(ctx context.Context, v *volume, g, s int, o uint64, n int, data []byte) (zero uint64, err error) {
	mu := r.lock(v, g, o)
	mu.Lock()
	defer mu.Unlock()
	rw := r.row(v, n)
	defer r.release(rw)
	// The shards being rebuilt before the placement: see volume.joining.
	joins := r.joiningAt(v, g, o)
	p := v.p.Load()
	if data != nil && len(joins) == 0 {
		if done, err := r.updateDelta(ctx, v, p, g, s, o, data, rw); done {
			return 0, err
		}
	}
	if err := r.readOthers(ctx, v, p, g, s, o, rw); err != nil {
		return 0, err
	}
	trim := data == nil
	if trim {
		clear(rw.shards[s])
	} else {
		copy(rw.shards[s], data)
	}
	if err := v.enc.Encode(rw.shards); err != nil {
		return 0, fmt.Errorf("ec: volume %q group %d: %w", v.Name, g, err)
	}
	// Write the data shard and the parity (every other data shard is
	// unchanged), every request sent before any is awaited.
	errs := rw.errs[:len(rw.shards)]
	clear(errs)
	for _, j := range joins {
		// A shard being rebuilt whose copy is past this row takes its
		// new bytes too (the copy holds this lock for each run).
		if node, local, _ := r.nodeByID(v, j.node); node != nil {
			at := p.NodeOffset(g, j.s, o)
			if err := node.WriteAt(ctx, local, at, rw.shards[j.s]); err != nil {
				j.done.Store(0) // the repair fails, and starts over
			}
		}
	}
	for x := range rw.shards {
		if x != s && x < p.K {
			continue
		}
		node, local, id := r.node(v, p, g, x)
		switch {
		case id == "":
			errs[x] = errShardLost
			continue
		case node == nil:
			errs[x] = fmt.Errorf("node %s: %w", id, pageid.ErrUnavailable)
			continue
		}
		at := p.NodeOffset(g, x, o)
		if trim && (x == s || isZero(rw.shards[x])) {
			zero |= 1 << x
			rw.calls[x] = node.TrimAsync(ctx, local, at, uint64(n))
		} else {
			rw.calls[x] = node.WriteAsync(ctx, local, at, rw.shards[x])
		}
		rw.sent[x] = true
	}
	rw.waitSent(ctx)
	if err := r.settle(ctx, v, p, g, s, errs, &zero); err != nil {
		return 0, err
	}
	v.redo.Delete(rowKey(g, o))
	return zero, nil
}

// updateDelta is update by the change alone, when the data shard's node
// and every parity shard's are there and the row is not to be redone:
// the data shard's old bytes are read, then the new ones written to it
// while each parity shard takes its coefficient times old xor new by
// exclusive or at its node (OpXor). That is 2 + M requests in two round
// trips where recoding the row takes K + M (docs/decisions.md, 28).
// done false: nothing changed, and update recodes the row. A write that
// fails once sent may have changed some parity and not the rest, and
// exclusive or is not idempotent: the row is marked to be recoded whole
// at its next write.
func (r *Remote) updateDelta(ctx context.Context, v *volume, p *cluster.Coded, g, s int, o uint64, data []byte, rw *row) (done bool, err error) {
	if _, redo := v.redo.Load(rowKey(g, o)); redo {
		return false, nil
	}
	n, local, id := r.node(v, p, g, s)
	if n == nil || r.suspect(id) {
		return false, nil
	}
	for x := p.K; x < p.Shards(); x++ {
		if pn, _, _ := r.node(v, p, g, x); pn == nil {
			return false, nil
		}
	}
	delta := rw.shards[s]
	if err := n.ReadAt(ctx, local, p.NodeOffset(g, s, o), delta); err != nil {
		return false, nil // recoding the row reads around it, or reports it
	}
	subtle.XORBytes(delta, delta, data)
	parity := rw.shards[p.K:p.Shards()]
	for _, b := range parity {
		clear(b)
	}
	if err := v.enc.EncodeIdx(delta, s, parity); err != nil {
		return true, fmt.Errorf("ec: volume %q group %d: %w", v.Name, g, err)
	}
	errs := rw.errs[:len(rw.shards)]
	clear(errs)
	rw.calls[s], rw.sent[s] = n.WriteAsync(ctx, local, p.NodeOffset(g, s, o), data), true
	for x := p.K; x < p.Shards(); x++ {
		pn, plocal, _ := r.node(v, p, g, x)
		rw.calls[x], rw.sent[x] = pn.XorAsync(ctx, plocal, p.NodeOffset(g, x, o), rw.shards[x]), true
	}
	rw.waitSent(ctx)
	var zero uint64
	if err := r.settle(ctx, v, p, g, s, errs, &zero); err != nil {
		v.redo.Store(rowKey(g, o), struct{}{})
		return true, err
	}
	return true, nil
}

// settle decides a row write from the errors of its shard writes (errs,
// by shard; the data shards other than s unchanged): the row holds the
// write where at least K of its shards agree with it, the data shards it
// did not change and still has and the shards that took it. A shard that
// missed it is dropped first; zero loses the bits of shards that failed.
func (r *Remote) settle(ctx context.Context, v *volume, p *cluster.Coded, g, s int, errs []error, zero *uint64) error {
	held := 0
	for x, err := range errs {
		if x != s && x < p.K {
			if p.Groups[g][x] != "" || p.Virtual(g, x) {
				held++
			}
			continue
		}
		if err == nil {
			held++
			continue
		}
		*zero &^= 1 << x
		if err == errShardLost {
			continue
		}
		if !memnode.NodeFault(ctx, err) {
			return fmt.Errorf("ec: volume %q group %d shard %d: %w", v.Name, g, x, err)
		}
		r.noteFault(p.Groups[g][x], err)
		if derr := r.drop(ctx, v, g, x); derr != nil {
			return fmt.Errorf("ec: volume %q group %d shard %d missed a write (%v) and could not be dropped: %w", v.Name, g, x, err, derr)
		}
	}
	if held < p.K {
		return fmt.Errorf("ec: volume %q group %d: %d of %d shards took the write: %w", v.Name, g, held, p.Shards(), ErrLost)
	}
	return nil
}

var errShardLost = errors.New("ec: shard lost")

// readOthers fills the row's data shards other than s with their current
// bytes: read from their nodes, or, where one cannot be read, decoded
// from the whole row as it stands (shard s's old bytes included).
func (r *Remote) readOthers(ctx context.Context, v *volume, p *cluster.Coded, g, s int, o uint64, rw *row) error {
	// Every read is sent before any is awaited: one round trip.
	errs := rw.errs[:p.K]
	clear(errs)
	for d := range p.K {
		if d == s {
			continue
		}
		if p.Virtual(g, d) {
			clear(rw.shards[d])
			continue
		}
		n, local, _ := r.node(v, p, g, d)
		if n == nil {
			errs[d] = errShardLost
			continue
		}
		rw.calls[d], rw.sent[d] = n.ReadAsync(ctx, local, p.NodeOffset(g, d, o), rw.shards[d]), true
	}
	rw.waitSent(ctx)
	for d, err := range errs {
		if err == nil || err == errShardLost {
			continue
		}
		if !memnode.NodeFault(ctx, err) {
			return fmt.Errorf("ec: volume %q group %d shard %d: %w", v.Name, g, d, err)
		}
		r.noteFault(p.Groups[g][d], err)
		return r.gather(ctx, v, g, o, rw)
	}
	for _, err := range errs {
		if err == errShardLost {
			return r.gather(ctx, v, g, o, rw)
		}
	}
	return nil
}

// drop records shard s of group g lost, here and in the control plane.
func (r *Remote) drop(ctx context.Context, v *volume, g, s int) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur := v.p.Load()
	if cur.Groups[g][s] == "" {
		return nil
	}
	next, err := r.ctl.DropShard(ctx, v.Name, g, s)
	if err != nil {
		return err
	}
	if next.Groups[g][s] != "" {
		return fmt.Errorf("ec: the control plane kept shard %d of group %d at %s", s, g, next.Groups[g][s])
	}
	r.Dropped.Add(1)
	v.p.Store(&next)
	return nil
}

// Has reports whether volume id is served here.
func (r *Remote) Has(id uint16) bool {
	_, ok := r.vols[id]
	return ok
}

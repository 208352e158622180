package ec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/remotetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rig is memory nodes in process (each its own server on loopback) and an
// erasure-coded volume over them.
type rig struct {
	srv     map[string]*memnode.Server
	clients map[string]*memnode.Client
	vol     Volume
	ctl     *mapControl
}

// mapControl keeps placements in memory as the control plane does in
// etcd.
type mapControl struct {
	mu     sync.Mutex
	p      map[string]*cluster.Coded
	refuse bool
}

func (c *mapControl) DropShard(_ context.Context, vol string, g, s int) (cluster.Coded, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.p[vol]
	if c.refuse {
		return p.Clone(), assert.AnError
	}
	if p.Drop(g, s) {
		p.Epoch++
	}
	return p.Clone(), nil
}

func (c *mapControl) SetShard(_ context.Context, vol string, g, s int, node string) (cluster.Coded, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.p[vol]
	if c.refuse {
		return p.Clone(), assert.AnError
	}
	p.Groups[g][s] = node
	p.Epoch++
	return p.Clone(), nil
}

const extent = memnode.ChunkSize

// newRig places a volume of size bytes with scheme sch over n nodes.
func newRig(t testing.TB, sch cluster.Scheme, n int, size uint64) *rig {
	t.Helper()
	ctx := context.Background()
	r := &rig{srv: map[string]*memnode.Server{}, clients: map[string]*memnode.Client{}}
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("n%d", i))
	}
	p, err := cluster.PlaceCoded(sch, size, extent, ids)
	require.NoError(t, err)
	r.vol = Volume{ID: 9, Name: "ev", Size: size, Placement: p, Local: map[string]uint16{}}
	for _, id := range ids {
		srv := &memnode.Server{Store: memnode.NewStore(0)}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go srv.Serve(ctx, ln)
		t.Cleanup(func() { srv.Close() })
		c, err := memnode.Dial(ctx, ln.Addr().String(), memnode.ClientOptions{OpTimeout: 5 * time.Second, DialTimeout: time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		info, err := c.Create(ctx, "ev", p.NodeBytes())
		require.NoError(t, err)
		r.srv[id], r.clients[id], r.vol.Local[id] = srv, c, info.ID
	}
	pc := p.Clone()
	r.ctl = &mapControl{p: map[string]*cluster.Coded{"ev": &pc}}
	return r
}

func (r *rig) remote(t testing.TB) *Remote {
	nodes := map[string]Node{}
	for id, c := range r.clients {
		nodes[id] = c
	}
	rem, err := New(nodes, []Volume{r.vol}, r.ctl)
	require.NoError(t, err)
	return rem
}

// stored is the bytes of memory the nodes hold.
func (r *rig) stored() uint64 {
	var n uint64
	for _, s := range r.srv {
		n += s.Store.Used()
	}
	return n
}

func TestConformance(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, 10*extent)
	remotetest.Run(t, r.remote(t), r.vol.ID, remotetest.Capabilities{PagesReader: true, AsyncReader: true, AsyncPagesReader: true, Trimmer: true, Bounded: true})
}

// model is what a volume must read as: the last bytes written to each
// page.
type model struct {
	mu    sync.Mutex
	pages map[uint64][]byte
}

func (m *model) set(pg uint64, b []byte) {
	m.mu.Lock()
	m.pages[pg] = bytes.Clone(b)
	m.mu.Unlock()
}

func fill(rnd *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rnd.Uint32())
	}
}

// check reads every page of the volume; lost says which pages may fail
// with ErrLost (nil: none may). No page may read other than written.
func (m *model) check(t *testing.T, rem *Remote, vol uint16, size uint64, lost func(pg uint64) bool) (failed int) {
	t.Helper()
	got := make([]byte, 4*pageid.Size)
	for pg := uint64(0); pg*pageid.Size < size; pg += 4 {
		err := rem.ReadPages(context.Background(), pageid.MakeKey(vol, pg), got)
		if err != nil {
			require.ErrorIs(t, err, ErrLost, "pages %d+4", pg)
			require.True(t, lost != nil && lost(pg), "pages %d+4 failed: %v", pg, err)
			failed++
			continue
		}
		for i := range uint64(4) {
			want := m.pages[pg+i]
			if want == nil {
				want = make([]byte, pageid.Size)
			}
			if g := got[i*pageid.Size : (i+1)*pageid.Size]; !bytes.Equal(want, g) {
				t.Fatalf("page %d reads other than written (zero: %v, want zero: %v)", pg+i, isZero(g), isZero(want))
			}
		}
	}
	return failed
}

// Two memory nodes lost while writers run (their servers closed, the
// connections cut, as a SIGKILL would): no write fails, every page reads
// as last written, the shards that missed writes are dropped; a third
// loss fails only pages whose rows lost more than M shards, never
// returning wrong bytes.
func TestTwoNodesLostDuringWrites(t *testing.T) {
	const size = 10 * extent // 10 data extents: 3 groups of 4+2, the last half empty
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, size)
	rem := r.remote(t)
	m := &model{pages: map[uint64][]byte{}}
	pages := size / pageid.Size

	var writes sync.WaitGroup
	var done atomic.Int64
	stop := make(chan struct{})
	for w := range 4 {
		writes.Add(1)
		go func() {
			defer writes.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, 8*pageid.Size)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Each writer owns the pages ≡ w mod 4 (in runs of one):
				// no two write one page at once, as the Store promises.
				pg := (rnd.Uint64N(uint64(pages/4)))*4 + uint64(w)
				n := 1
				fill(rnd, buf[:n*pageid.Size])
				if err := rem.WriteAt(context.Background(), r.vol.ID, pg*pageid.Size, buf[:n*pageid.Size]); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				m.set(pg, buf[:pageid.Size])
				done.Add(1)
			}
		}()
	}
	// Wait for n more writes (or for the writers to have failed).
	await := func(n int64) {
		for target := done.Load() + n; done.Load() < target && !t.Failed(); {
			runtime.Gosched()
		}
	}
	await(200)
	r.srv["n1"].Close()
	await(200)
	r.srv["n4"].Close()
	await(200)
	close(stop)
	writes.Wait()
	require.False(t, t.Failed())
	// One write into every data extent: every shard at a lost node has
	// now missed one.
	one := make([]byte, pageid.Size)
	for e := uint64(0); e*extent < size; e++ {
		fill(rand.New(rand.NewPCG(e, 9)), one)
		require.NoError(t, rem.WriteAt(context.Background(), r.vol.ID, e*extent, one))
		m.set(e*extent/pageid.Size, one)
	}

	assert.NotZero(t, rem.Dropped.Load(), "shards at the lost nodes missed writes and were dropped")
	p, _ := rem.Placement(r.vol.ID)
	assert.Equal(t, *r.ctl.p["ev"], p, "the host's placement is the control plane's")
	for g, row := range p.Groups {
		for s, id := range row {
			assert.False(t, !p.Virtual(g, s) && (id == "n1" || id == "n4"), "group %d shard %d still at a lost node", g, s)
		}
	}
	m.check(t, rem, r.vol.ID, size, nil)
	assert.NotZero(t, rem.Decoded.Load(), "reads of the lost shards were decoded")

	// A third loss: rows with three shards gone fail, the rest read.
	r.srv["n2"].Close()
	down := func(g, s int) bool {
		id := p.Groups[g][s]
		return !p.Virtual(g, s) && (id == "" || id == "n1" || id == "n2" || id == "n4")
	}
	failed := m.check(t, rem, r.vol.ID, size, func(pg uint64) bool {
		g, s, _ := p.Locate(pg * pageid.Size)
		gone := 0
		for x := range p.Groups[g] {
			if down(g, x) {
				gone++
			}
		}
		return gone > 2 && down(g, s)
	})
	t.Logf("after a third loss: %d of %d four-page reads failed (ErrLost)", failed, pages/4)
}

// Memory at the nodes is (K+M)/K of the bytes written.
func TestMemoryIsKPlusMOverK(t *testing.T) {
	const size = 8 * extent // two full groups
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, size)
	rem := r.remote(t)
	buf := make([]byte, extent)
	fill(rand.New(rand.NewPCG(1, 2)), buf)
	for off := uint64(0); off < size; off += extent {
		require.NoError(t, rem.WriteAt(context.Background(), r.vol.ID, off, buf))
	}
	assert.Equal(t, 1.5, float64(r.stored())/size)
}

// A shard page corrupt at its node (a byte flipped behind the node's
// checksum) is never returned: the read decodes it from the row and
// writes it back healed. With more than M corrupt shards in a row the
// read fails.
func TestCorruptShardIsDetectedAndHealed(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, 8*extent)
	rem := r.remote(t)
	m := &model{pages: map[uint64][]byte{}}
	rnd := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 64*pageid.Size)
	for pg := uint64(0); pg < 8*extent/pageid.Size; pg += 64 {
		fill(rnd, buf)
		require.NoError(t, rem.WriteAt(context.Background(), r.vol.ID, pg*pageid.Size, buf))
		for i := range uint64(64) {
			m.set(pg+i, buf[i*pageid.Size:(i+1)*pageid.Size])
		}
	}
	p := r.vol.Placement
	corrupt := func(g, s int, o uint64) {
		id := p.Groups[g][s]
		require.NoError(t, r.srv[id].Store.CorruptForTest(r.vol.Local[id], p.NodeOffset(g, s, o)+100))
	}
	corrupt(0, 1, 5*pageid.Size) // a data page
	corrupt(1, 0, 9*pageid.Size) // a data page, and a parity page of its row
	corrupt(1, 4, 9*pageid.Size)
	m.check(t, rem, r.vol.ID, 8*extent, nil)
	assert.Equal(t, uint64(3), rem.Healed.Load(), "three corrupt shard runs rewritten")
	id := p.Groups[0][1]
	got := make([]byte, pageid.Size)
	require.NoError(t, r.clients[id].ReadAt(context.Background(), r.vol.Local[id], p.NodeOffset(0, 1, 5*pageid.Size), got), "healed at its node")

	// Three corrupt shards of one row: M+1, the row's pages fail.
	for s := range 3 {
		corrupt(0, s, 20*pageid.Size)
	}
	for d := range 3 {
		err := rem.ReadPage(context.Background(), pageid.MakeKey(r.vol.ID, (uint64(d)*extent+20*pageid.Size)/pageid.Size), got)
		assert.ErrorIs(t, err, ErrLost, "data shard %d", d)
	}
}

// A shard that cannot be dropped after it missed a write fails the write:
// acknowledging it would leave a stale shard in the placement.
func TestWriteFailsWhenAShardCannotBeDropped(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 2, M: 1}, 3, 2*extent)
	rem := r.remote(t)
	r.ctl.refuse = true
	r.srv["n2"].Close()
	err := rem.WriteAt(context.Background(), r.vol.ID, 0, make([]byte, pageid.Size))
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrLost))
	assert.Contains(t, err.Error(), "could not be dropped")
}

// flaky fails its node's writes while failing is set, as a node cut off
// for a moment would, and answers reads again once it is cleared.
type flaky struct {
	Node
	failing atomic.Bool
	err     error // XorAsync's failure, if set
}

func (f *flaky) WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return f.WriteAsync(ctx, vol, off, p).Wait(ctx)
}

func (f *flaky) WriteAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call {
	if f.failing.Load() {
		return memnode.DoneCall(fmt.Errorf("flaky: %w", pageid.ErrUnavailable))
	}
	return f.Node.WriteAsync(ctx, vol, off, p)
}

// XorAsync fails like WriteAsync; with err set it fails with err instead.
func (f *flaky) XorAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call {
	if f.failing.Load() {
		if f.err != nil {
			return memnode.DoneCall(f.err)
		}
		return memnode.DoneCall(fmt.Errorf("flaky: %w", pageid.ErrUnavailable))
	}
	return f.Node.XorAsync(ctx, vol, off, p)
}

// withFlaky serves r's volume over its nodes, the holder of shard s of
// group 0 behind a flaky.
func withFlaky(t *testing.T, r *rig, s int) (*Remote, *flaky) {
	holder := r.vol.Placement.Groups[0][s]
	nodes := map[string]Node{}
	f := &flaky{}
	for id, c := range r.clients {
		nodes[id] = c
		if id == holder {
			f.Node = c
			nodes[id] = f
		}
	}
	rem, err := New(nodes, []Volume{r.vol}, r.ctl)
	require.NoError(t, err)
	return rem, f
}

// A write by the change alone (OpXor at the parity shards) that a parity
// shard misses drops that shard, and the row still decodes right with as
// many more losses as the code has parity left.
func TestParityThatMissedAChangeIsDropped(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, 4*extent)
	rem, f := withFlaky(t, r, 4)
	ctx := context.Background()
	off := uint64(5 * pageid.Size) // data shard 0 of group 0
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, bytes.Repeat([]byte{1}, pageid.Size)))
	f.failing.Store(true)
	cur := bytes.Repeat([]byte{2}, pageid.Size)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, cur))
	f.failing.Store(false)
	assert.Equal(t, uint64(1), rem.Dropped.Load(), "the parity shard that missed the change")
	r.srv[r.vol.Placement.Groups[0][0]].Close()
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(r.vol.ID, off/pageid.Size), got))
	assert.Equal(t, cur, got, "decoded from the other parity shard, which took the change")
}

// A write by the change alone that fails with the parity half changed
// marks the row: its next write recodes the whole row, so a parity shard
// that missed the change is rewritten, not left stale to decode from.
func TestFailedChangeIsRecodedWhole(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, 4*extent)
	rem, f := withFlaky(t, r, 4)
	ctx := context.Background()
	off := uint64(5 * pageid.Size)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, bytes.Repeat([]byte{1}, pageid.Size)))
	f.err = fmt.Errorf("flaky: %w", memnode.ErrBadRequest) // not the node's fault: not dropped
	f.failing.Store(true)
	cur := bytes.Repeat([]byte{2}, pageid.Size)
	require.Error(t, rem.WriteAt(ctx, r.vol.ID, off, cur))
	f.failing.Store(false)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, cur), "the retry")
	assert.Zero(t, rem.Dropped.Load())
	// Decode with the stale-prone parity shard: data shard 0 and parity
	// shard 5 gone.
	r.srv[r.vol.Placement.Groups[0][0]].Close()
	r.srv[r.vol.Placement.Groups[0][5]].Close()
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(r.vol.ID, off/pageid.Size), got))
	assert.Equal(t, cur, got, "decoded with the parity shard that missed the first try")
}

// A shard that missed a write is dropped and never read again, even when
// its node answers once more with the old bytes.
func TestShardThatMissedAWriteIsNeverRead(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 2, M: 1}, 3, 4*extent)
	rem, f := withFlaky(t, r, 1) // data extent 1
	ctx := context.Background()
	off := uint64(extent + 3*pageid.Size)
	old, cur := bytes.Repeat([]byte{1}, pageid.Size), bytes.Repeat([]byte{2}, pageid.Size)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, old))
	f.failing.Store(true)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, cur), "parity took it; the data shard is dropped")
	f.failing.Store(false)
	assert.Equal(t, uint64(1), rem.Dropped.Load())
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(r.vol.ID, off/pageid.Size), got))
	assert.Equal(t, cur, got, "decoded, not the old bytes its node still has")
	q, _ := rem.Placement(r.vol.ID)
	assert.Equal(t, "", q.Groups[0][1])
	d, l := q.Health()
	assert.Equal(t, 1, d)
	assert.Zero(t, l)
}

// A trim reads as zeroes, keeps the rows decodable, and frees the memory
// of every chunk it leaves all zeroes, parity included: a trim of the
// whole volume leaves nothing stored.
func TestTrimFreesMemoryAndKeepsParity(t *testing.T) {
	const size = 8 * extent
	r := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, size)
	rem := r.remote(t)
	ctx := context.Background()
	m := &model{pages: map[uint64][]byte{}}
	buf := make([]byte, extent)
	rnd := rand.New(rand.NewPCG(5, 6))
	for off := uint64(0); off < size; off += extent {
		fill(rnd, buf)
		require.NoError(t, rem.WriteAt(ctx, r.vol.ID, off, buf))
		for i := uint64(0); i < extent/pageid.Size; i++ {
			m.set(off/pageid.Size+i, buf[i*pageid.Size:(i+1)*pageid.Size])
		}
	}
	// Part of one extent: zeroes there, the rest as written, and still so
	// with two nodes gone (the parity was coded for the zeroes).
	require.NoError(t, rem.Trim(ctx, r.vol.ID, extent+8*pageid.Size, 100*pageid.Size))
	for i := uint64(0); i < 100; i++ {
		delete(m.pages, extent/pageid.Size+8+i)
	}
	m.check(t, rem, r.vol.ID, size, nil)
	all := rem.Placement
	p, _ := all(r.vol.ID)
	r.srv[p.Groups[0][1]].Close()
	r.srv[p.Groups[0][4]].Close()
	m.check(t, rem, r.vol.ID, size, nil)

	// The whole volume, on fresh nodes: nothing stored afterwards.
	r2 := newRig(t, cluster.Scheme{K: 4, M: 2}, 6, size)
	rem2 := r2.remote(t)
	for off := uint64(0); off < size; off += extent {
		require.NoError(t, rem2.WriteAt(ctx, r2.vol.ID, off, buf))
	}
	require.Equal(t, uint64(size*3/2), r2.stored())
	require.NoError(t, rem2.Trim(ctx, r2.vol.ID, 0, size))
	assert.Zero(t, r2.stored(), "every chunk of data and parity freed")
	(&model{pages: map[uint64][]byte{}}).check(t, rem2, r2.vol.ID, size, nil)
}

// Repair rebuilds the shards two lost nodes held on two fresh nodes while
// writers run, and the rows written during the copy reach the new nodes:
// after it the volume is healthy, and losing two other nodes loses
// nothing.
func TestRepairUnderWritesThenTwoMoreLosses(t *testing.T) {
	const size = 8 * extent
	r := newRig(t, cluster.Scheme{K: 2, M: 2}, 6, size) // 2+2: every group on 4 of the 6 nodes
	ctx := context.Background()
	// Two spare nodes to rebuild on.
	spares := newRig(t, cluster.Scheme{K: 2, M: 2}, 4, size)
	rem := r.remote(t)
	m := &model{pages: map[uint64][]byte{}}
	pages := size / pageid.Size
	write := func(rnd *rand.Rand, w int) bool {
		buf := make([]byte, pageid.Size)
		pg := rnd.Uint64N(uint64(pages/4))*4 + uint64(w)
		fill(rnd, buf)
		if err := rem.WriteAt(ctx, r.vol.ID, pg*pageid.Size, buf); err != nil {
			t.Errorf("writing page %d: %v", pg, err)
			return false
		}
		m.set(pg, buf)
		return true
	}
	rnd := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		write(rnd, int(rnd.Uint64N(4)))
	}
	r.srv["n0"].Close()
	r.srv["n3"].Close()
	require.NoError(t, rem.DropNode(ctx, "n0"))
	require.NoError(t, rem.DropNode(ctx, "n3"))
	lost := rem.Lost(r.vol.ID)
	require.NotEmpty(t, lost)

	// Writers run through the repair.
	var writes sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		writes.Add(1)
		go func() {
			defer writes.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 8))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !write(rnd, w) {
					return
				}
			}
		}()
	}
	for i, id := range []string{"n0", "n1"} { // the spare rig's nodes
		name := fmt.Sprintf("s%d", i)
		require.NoError(t, rem.AddNode(ctx, name, spares.clients[id], r.vol.ID, spares.vol.Local[id])) // its volume "ev" is as large
	}
	for i, gs := range lost {
		q, _ := rem.Placement(r.vol.ID)
		target := "s0"
		if slices.Contains(q.Groups[gs[0]], target) || i%2 == 1 && !slices.Contains(q.Groups[gs[0]], "s1") {
			target = "s1"
		}
		require.NoError(t, rem.Repair(ctx, r.vol.ID, gs[0], gs[1], target, nil), "group %d shard %d", gs[0], gs[1])
	}
	close(stop)
	writes.Wait()
	q, _ := rem.Placement(r.vol.ID)
	d, l := q.Health()
	assert.Zero(t, d, "healthy after the repair: %v", q.Groups)
	assert.Zero(t, l)
	assert.Equal(t, uint64(len(lost)), rem.Repaired.Load())
	m.check(t, rem, r.vol.ID, size, nil)

	// Two more losses, of nodes the repair did not touch: nothing lost.
	r.srv["n1"].Close()
	r.srv["n4"].Close()
	m.check(t, rem, r.vol.ID, size, nil)
}

// A row torn by a host that stopped between a data write and its parity
// (the data shard written at its node, the parity not) decodes wrong
// after a loss; Resync re-encodes the parity from the data, and the
// decode is right again. A volume that is whole rewrites nothing.
func TestResyncMendsATornRow(t *testing.T) {
	r := newRig(t, cluster.Scheme{K: 2, M: 1}, 3, 2*extent)
	rem := r.remote(t)
	ctx := context.Background()
	a, b := bytes.Repeat([]byte{0xa}, pageid.Size), bytes.Repeat([]byte{0xb}, pageid.Size)
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, 0, a))      // data shard 0, row 0
	require.NoError(t, rem.WriteAt(ctx, r.vol.ID, extent, b)) // data shard 1, row 0
	n, err := rem.Resync(ctx, r.vol.ID)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing torn")

	// The crash: shard 0's new bytes at its node, the parity not updated.
	p := r.vol.Placement
	torn := bytes.Repeat([]byte{0xc}, pageid.Size)
	id0 := p.Groups[0][0]
	require.NoError(t, r.clients[id0].WriteAt(ctx, r.vol.Local[id0], p.NodeOffset(0, 0, 0), torn))
	n, err = rem.Resync(ctx, r.vol.ID)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "row 0's parity run rewritten")

	// Shard 1's node lost: its page decodes from shard 0 and the parity.
	r.srv[p.Groups[0][1]].Close()
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(r.vol.ID, extent/pageid.Size), got))
	assert.True(t, bytes.Equal(b, got), "decoded right after the resync")
}

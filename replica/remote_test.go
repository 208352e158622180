package replica

import (
	"context"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/remotetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rig is three memory nodes in process and a replicated volume over them.
type rig struct {
	srv     map[string]*memnode.Server
	addr    map[string]string
	clients map[string]*memnode.Client
	vol     Volume
	drops   *mapDropper
}

// mapDropper keeps stripe maps in memory as the control plane does in
// etcd (the same cluster.Stripes changes); refuse makes it fail.
type mapDropper struct {
	mu     sync.Mutex
	maps   map[string]*cluster.Stripes
	refuse bool
}

func (d *mapDropper) update(vol string, fn func(s *cluster.Stripes) (bool, error)) (cluster.Stripes, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.maps[vol]
	if d.refuse {
		return *s, assert.AnError
	}
	next := s.Clone()
	changed, err := fn(&next)
	if err != nil || !changed {
		return s.Clone(), err
	}
	next.Epoch++
	*s = next
	return next.Clone(), nil
}

func (d *mapDropper) DropReplica(_ context.Context, vol string, e int, node string) (cluster.Stripes, error) {
	return d.update(vol, func(s *cluster.Stripes) (bool, error) { return s.Drop(e, node) })
}

func (d *mapDropper) AddJoining(_ context.Context, vol string, e int, node string) (cluster.Stripes, error) {
	return d.update(vol, func(s *cluster.Stripes) (bool, error) { return true, s.Join(e, node) })
}

func (d *mapDropper) Promote(_ context.Context, vol string, e int, node string) (cluster.Stripes, error) {
	return d.update(vol, func(s *cluster.Stripes) (bool, error) { return true, s.Promote(e, node) })
}

func clone(s cluster.Stripes) cluster.Stripes { return s.Clone() }

// newRig places a volume of pages pages in extents of extentPages pages,
// two replicas each, round robin over nodes a, b, c; wrap, if set, puts a
// proxy in front of a node (a Gate).
func newRig(t testing.TB, pages, extentPages int, opTimeout time.Duration, wrap map[string]func(string) string) *rig {
	t.Helper()
	ctx := context.Background()
	r := &rig{srv: map[string]*memnode.Server{}, addr: map[string]string{}, clients: map[string]*memnode.Client{}}
	ids := []string{"a", "b", "c"}
	size := uint64(pages) * pageid.Size
	s := cluster.Stripes{Epoch: 1, ExtentBytes: uint64(extentPages) * pageid.Size, Replicas: 2}
	for e := 0; e*extentPages < pages; e++ {
		s.Extents = append(s.Extents, []string{ids[e%3], ids[(e+1)%3]})
	}
	r.vol = Volume{ID: 7, Name: "rv", Size: size, Stripes: s, Local: map[string]uint16{}}
	cork := new(pipeline.Cork) // as a host wires its clients
	for _, id := range ids {
		srv := &memnode.Server{Store: memnode.NewStore(0)}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go srv.Serve(ctx, ln)
		t.Cleanup(func() { srv.Close() })
		addr := ln.Addr().String()
		if w := wrap[id]; w != nil {
			addr = w(addr)
		}
		c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{OpTimeout: opTimeout, DialTimeout: time.Second, Cork: cork})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		v, err := c.Create(ctx, "rv", size)
		require.NoError(t, err)
		r.srv[id], r.addr[id], r.clients[id], r.vol.Local[id] = srv, addr, c, v.ID
	}
	r.drops = &mapDropper{maps: map[string]*cluster.Stripes{"rv": ptr(clone(s))}}
	return r
}

func ptr[T any](v T) *T { return &v }

func (r *rig) remote(t testing.TB) *Remote {
	rem, err := New(r.clients, []Volume{r.vol}, r.drops)
	require.NoError(t, err)
	return rem
}

// The contract every Remote keeps, over extents of 16 pages spread on
// three nodes.
func TestConformance(t *testing.T) {
	r := newRig(t, remotetest.Pages, 16, 5*time.Second, nil)
	remotetest.Run(t, r.remote(t), r.vol.ID, remotetest.Capabilities{PagesReader: true, AsyncReader: true, AsyncPagesReader: true, Trimmer: true, Mapper: true, Bounded: true})
}

func page(b byte) []byte {
	p := make([]byte, pageid.Size)
	for i := range p {
		p[i] = b + byte(i)
	}
	return p
}

func writeAll(t *testing.T, rem *Remote, pages int, seed byte) {
	t.Helper()
	var keys []pageid.Key
	var data [][]byte
	for i := range pages {
		keys = append(keys, pageid.MakeKey(7, uint64(i)))
		data = append(data, page(seed+byte(i)))
	}
	require.NoError(t, rem.WritePages(context.Background(), keys, data))
}

func readAll(t *testing.T, rem *Remote, pages int, seed byte) {
	t.Helper()
	got := make([]byte, pageid.Size)
	for i := range pages {
		require.NoError(t, rem.ReadPage(context.Background(), pageid.MakeKey(7, uint64(i)), got), "page %d", i)
		require.Equal(t, page(seed+byte(i)), got, "page %d", i)
	}
}

// A batch of writes sends each node its requests in one write, not one
// each (docs/decisions.md, 48).
func TestABatchOfWritesLeavesInOneWritePerNode(t *testing.T) {
	r := newRig(t, 3, 1, 5*time.Second, nil) // extents on ab, bc, ca: two pages a node
	rem := r.remote(t)
	before := map[string]uint64{}
	for id, c := range r.clients {
		before[id] = c.RequestWrites()
	}
	writeAll(t, rem, 3, 1)
	for id, c := range r.clients {
		assert.Equal(t, uint64(1), c.RequestWrites()-before[id], "writes to node %s carrying its two pages", id)
	}
	readAll(t, rem, 3, 1)
}

// A node that dies: reads fail over to the other replica, writes land on
// the survivor and drop the dead node from the extents it held, and the
// map never lists it again — so when it comes back with old bytes, nobody
// reads them.
func TestNodeLossFailsOverAndDrops(t *testing.T) {
	r := newRig(t, 96, 16, 5*time.Second, nil)
	rem := r.remote(t)
	writeAll(t, rem, 96, 1)

	r.srv["b"].Close()
	readAll(t, rem, 96, 1)
	assert.NotZero(t, rem.Failovers.Load(), "reads of b's extents went on to their other replica")
	writeAll(t, rem, 96, 50)
	readAll(t, rem, 96, 50)
	s, _ := rem.Stripes(7)
	for e, reps := range s.Extents {
		assert.NotContains(t, reps, "b", "extent %d", e)
		assert.NotEmpty(t, reps, "extent %d", e)
	}
	assert.Equal(t, uint64(4), rem.Dropped.Load(), "b held 4 of the 6 extents")
	assert.Equal(t, s, *r.drops.maps["rv"], "the host's map is the control plane's")
	deg, lost := s.Degraded()
	assert.Equal(t, 4, deg)
	assert.Zero(t, lost)
}

// Without a way to drop a replica that missed a write, the write fails:
// acknowledging it would leave a replica with old bytes in the map.
func TestWriteFailsWhenTheReplicaCannotBeDropped(t *testing.T) {
	r := newRig(t, 32, 16, 5*time.Second, nil)
	rem := r.remote(t)
	writeAll(t, rem, 32, 1)
	r.srv["a"].Close()
	r.drops.refuse = true
	err := rem.WritePages(context.Background(), []pageid.Key{pageid.MakeKey(7, 0)}, [][]byte{page(9)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "could not be dropped")
	s, _ := rem.Stripes(7)
	assert.Contains(t, s.Extents[0], "a", "the map is unchanged")
}

// Both replicas of an extent gone: its pages fail, never read as zeroes;
// the other extents are served.
func TestLostExtentFailsItsPagesOnly(t *testing.T) {
	r := newRig(t, 48, 16, 5*time.Second, nil) // extents: ab, bc, ca
	rem := r.remote(t)
	writeAll(t, rem, 48, 1)
	r.srv["a"].Close()
	r.srv["b"].Close()
	got := make([]byte, pageid.Size)
	err := rem.ReadPage(context.Background(), pageid.MakeKey(7, 3), got)
	assert.ErrorIs(t, err, pageid.ErrUnavailable)
	assert.Contains(t, err.Error(), "every replica failed")
	err = rem.WritePages(context.Background(), []pageid.Key{pageid.MakeKey(7, 3)}, [][]byte{page(9)})
	assert.Contains(t, err.Error(), "no replica took it")
	for _, p := range []int{16, 40} { // bc: c is left; ca: c
		require.NoError(t, rem.ReadPage(context.Background(), pageid.MakeKey(7, uint64(p)), got))
		assert.Equal(t, page(1+byte(p)), got)
	}
}

// A node cut off (packets vanish, no reset): a read waits for the op
// timeout, then fails over; the node is tried last while it is suspect,
// so the next reads do not wait; a write drops it.
func TestPartitionedNodeIsTriedLast(t *testing.T) {
	var gate *testnet.Gate
	r := newRig(t, 32, 16, 500*time.Millisecond, map[string]func(string) string{
		"a": func(addr string) string { gate = testnet.NewGate(t, addr); return gate.Addr },
	})
	rem := r.remote(t)
	writeAll(t, rem, 32, 1)
	gate.Cut()
	t.Cleanup(gate.Release)
	start := time.Now()
	readAll(t, rem, 32, 1)
	assert.Less(t, time.Since(start), 3*time.Second, "one op timeout, not one per page")
	writeAll(t, rem, 32, 70)
	s, _ := rem.Stripes(7)
	assert.NotContains(t, s.Extents[0], "a")
	gate.Release()
	readAll(t, rem, 32, 70) // a is back with old bytes: never read
}

// A node the control plane reports down leaves every map, but not as the
// last replica of an extent.
func TestDropNode(t *testing.T) {
	r := newRig(t, 48, 16, 5*time.Second, nil) // extents: ab, bc, ca
	rem := r.remote(t)
	require.NoError(t, rem.DropNode(context.Background(), "b"))
	s, _ := rem.Stripes(7)
	assert.Equal(t, [][]string{{"a"}, {"c"}, {"c", "a"}}, s.Extents)
	err := rem.DropNode(context.Background(), "c")
	assert.ErrorIs(t, err, cluster.ErrLastReplica)
	s, _ = rem.Stripes(7)
	assert.Equal(t, [][]string{{"a"}, {"c"}, {"a"}}, s.Extents)
}

// Repair under writes: b dies, extent 0 (a, b) is copied to c while a
// writer keeps rewriting pages of it; c had stale bytes of the extent
// from an earlier life, and chunks the source never wrote stay empty.
// Then a dies too: everything reads from c, as last written.
func TestRepairUnderWrites(t *testing.T) {
	const pages = 48 // extents of 16 pages: ab, bc, ca
	r := newRig(t, pages, 16, 5*time.Second, nil)
	rem := r.remote(t)
	ctx := context.Background()
	require.NoError(t, rem.Fence(ctx, 7, 5))
	writeAll(t, rem, pages, 1)
	// Stale bytes at c in extent 0, which c does not hold.
	require.NoError(t, r.clients["c"].WriteAt(ctx, r.vol.Local["c"], 9*pageid.Size, page(200)))

	r.srv["b"].Close()
	require.NoError(t, rem.DropNode(ctx, "b"))
	assert.Equal(t, []int{0, 1}, rem.Degraded(7))

	var mu sync.Mutex
	last := map[int][]byte{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := i % 8 // pages 0-7 of extent 0; page 9 is left alone
			data := page(byte(100 + i))
			if err := rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(7, uint64(p))}, [][]byte{data}); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			last[p] = data
			mu.Unlock()
		}
	}()
	var paced int
	// A chunk's copy holds its lock: writes wait, and a slow copy is what
	// lets them pile up. A span of time is the point.
	rem.copied = func(uint16) { time.Sleep(5 * time.Millisecond) }
	require.NoError(t, rem.Repair(ctx, 7, 0, "c", r.clients["c"], func(n int) { paced += n }))
	close(stop)
	wg.Wait()
	assert.Equal(t, 16*pageid.Size, paced, "every byte of the extent was read once")
	s, _ := rem.Stripes(7)
	assert.ElementsMatch(t, []string{"a", "c"}, s.Extents[0])
	assert.Empty(t, s.Joining[0])
	assert.Equal(t, []int{1}, rem.Degraded(7))
	fenced, err := r.srv["c"].Store.Fence(r.vol.Local["c"])
	require.NoError(t, err)
	assert.Equal(t, uint64(5), fenced, "the new replica has the volume's token")

	r.srv["a"].Close()
	require.NoError(t, rem.DropNode(ctx, "a"))
	got := make([]byte, pageid.Size)
	for p := range 16 {
		require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(7, uint64(p)), got), "page %d", p)
		want, ok := last[p]
		if !ok {
			want = page(1 + byte(p))
		}
		assert.Equal(t, want, got, "page %d", p)
	}
}

// withoutB is a rig of extents of two chunks (ab, bc, ca), written, whose
// node b died and was dropped.
func withoutB(t *testing.T) (*rig, *Remote) {
	r := newRig(t, 3*512, 512, 5*time.Second, nil)
	rem := r.remote(t)
	writeAll(t, rem, 3*512, 1)
	r.srv["b"].Close()
	require.NoError(t, rem.DropNode(context.Background(), "b"))
	return r, rem
}

// A joining node that fails during the copy is dropped again, and the
// extent stays as it was.
func TestRepairTargetFails(t *testing.T) {
	r, rem := withoutB(t)
	ctx := context.Background()
	err := rem.Repair(ctx, 7, 0, "c", r.clients["c"], func(int) { r.srv["c"].Close() })
	require.Error(t, err)
	s, _ := rem.Stripes(7)
	assert.Equal(t, []string{"a"}, s.Extents[0])
	assert.Empty(t, s.Joining[0])
	readAll(t, rem, 512, 1)
}

// A repair target that held the extent in an earlier life (stale bytes)
// shows none of them afterwards, even in chunks the source never wrote.
func TestRepairClearsStaleBytes(t *testing.T) {
	r := newRig(t, 3*512, 512, 5*time.Second, nil) // extents of two chunks: ab, bc, ca
	rem := r.remote(t)
	ctx := context.Background()
	writeAll(t, rem, 10, 1)
	require.NoError(t, r.clients["c"].WriteAt(ctx, r.vol.Local["c"], 300*pageid.Size, page(200)))
	r.srv["b"].Close()
	require.NoError(t, rem.DropNode(ctx, "b"))
	require.NoError(t, rem.Repair(ctx, 7, 0, "c", r.clients["c"], nil))
	r.srv["a"].Close()
	require.NoError(t, rem.DropNode(ctx, "a"))
	readAll(t, rem, 10, 1)
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(7, 300), got))
	assert.Equal(t, make([]byte, pageid.Size), got, "the stale page")
}

// A repair copies what the replicas store, not the whole extent: the
// chunks a MAP calls holes are not even read.
func TestRepairCopiesWhatIsStored(t *testing.T) {
	r := newRig(t, 3*2048, 2048, 5*time.Second, nil) // extents of 8 chunks: ab, bc, ca
	rem := r.remote(t)
	ctx := context.Background()
	require.NoError(t, rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(7, 300)}, [][]byte{page(9)}))
	r.srv["b"].Close()
	require.NoError(t, rem.DropNode(ctx, "b"))
	paced := 0
	require.NoError(t, rem.Repair(ctx, 7, 0, "c", r.clients["c"], func(n int) { paced += n }))
	assert.Equal(t, uint64(memnode.ChunkSize), rem.RepairBytes.Load(), "one chunk of eight holds memory")
	assert.Equal(t, memnode.ChunkSize, paced, "the throttle counts what was read")
	r.srv["a"].Close()
	require.NoError(t, rem.DropNode(ctx, "a"))
	got := make([]byte, pageid.Size)
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(7, 300), got))
	assert.Equal(t, page(9), got, "the page, from c alone")
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(7, 1000), got))
	assert.Equal(t, make([]byte, pageid.Size), got)
}

// Moving extents off a node: each is copied to the new node, then the
// old replica is dropped and its range freed there; once the node holds
// no extent of the volume, its copy of the volume is deleted.
func TestMove(t *testing.T) {
	r := newRig(t, 48, 16, 5*time.Second, nil) // extents: ab, bc, ca
	rem := r.remote(t)
	ctx := context.Background()
	require.NoError(t, rem.Fence(ctx, 7, 3))
	writeAll(t, rem, 48, 1)
	storedAt := func(id string) uint64 {
		v, err := r.srv[id].Store.Open("rv")
		if err != nil {
			return 0
		}
		return v.Stored
	}
	require.Equal(t, uint64(memnode.ChunkSize), storedAt("a"), "extents 0 and 2, in one chunk")

	require.NoError(t, rem.Move(ctx, 7, 0, "a", "c", r.clients["c"], nil))
	s, _ := rem.Stripes(7)
	assert.ElementsMatch(t, []string{"b", "c"}, s.Extents[0])
	require.NoError(t, rem.Move(ctx, 7, 2, "a", "b", r.clients["b"], nil))
	s, _ = rem.Stripes(7)
	assert.ElementsMatch(t, []string{"c", "b"}, s.Extents[2])
	assert.NotContains(t, s.Nodes(), "a")
	_, err := r.srv["a"].Store.Open("rv")
	assert.ErrorIs(t, err, pageid.ErrNoVolume, "a holds nothing of the volume")
	assert.Equal(t, uint64(0), r.srv["a"].Store.Used())
	r.srv["a"].Close()
	readAll(t, rem, 48, 1)
}

// ReadFn (the transfer engine's non-blocking host miss) goes to one
// replica and, when that node is dead, on to another without the caller
// seeing it; ReadAsync, a prefetch's read, does not fail over, and a read
// spanning two extents is refused rather than served from one.
func TestReadFnFailsOver(t *testing.T) {
	r := newRig(t, 96, 16, 2*time.Second, nil)
	rem := r.remote(t)
	writeAll(t, rem, 96, 3)
	r.srv["b"].Close()
	for i := range 96 {
		got := make([]byte, pageid.Size)
		done := make(chan error, 1)
		rem.ReadFn(7, uint64(i)*pageid.Size, got, func(err error) { done <- err })
		require.NoError(t, <-done, "page %d", i)
		require.Equal(t, page(3+byte(i)), got, "page %d", i)
	}
	assert.NotZero(t, rem.Failovers.Load())

	span := make([]byte, 2*pageid.Size)
	assert.Error(t, rem.ReadAsync(context.Background(), 7, 15*pageid.Size, span).Wait(context.Background()))
	assert.Equal(t, 1, rem.Span(pageid.MakeKey(7, 15), 2))
	assert.Equal(t, 2, rem.Span(pageid.MakeKey(7, 16), 2))
}

// A repair target whose copy predates the volume's growth (its node was
// down during pd3 volume resize) has the copy grown first.
func TestRepairGrowsASmallerCopy(t *testing.T) {
	r, rem := withoutB(t)
	ctx := context.Background()
	require.NoError(t, r.clients["c"].Delete(ctx, "rv"))
	_, err := r.clients["c"].Create(ctx, "rv", 1<<20)
	require.NoError(t, err)
	require.NoError(t, rem.Repair(ctx, 7, 0, "c", r.clients["c"], nil))
	info, err := r.clients["c"].Open(ctx, "rv")
	require.NoError(t, err)
	assert.Equal(t, r.vol.Size, info.Size)
	r.srv["a"].Close()
	require.NoError(t, rem.DropNode(ctx, "a"))
	readAll(t, rem, 512, 1) // extent 0, from c alone
}

// progress counts what a test's goroutine did (n) until it stops (done),
// for another that paces itself on it.
type progress struct {
	n    atomic.Int64
	done atomic.Bool
}

// await returns once n has grown by k (or the counted goroutine stopped).
func (w *progress) await(k int64) {
	for target := w.n.Load() + k; w.n.Load() < target && !w.done.Load(); {
		runtime.Gosched()
	}
}

// A page corrupt at one replica (its node's checksum no longer matches)
// is read from the other: the bytes the host gets are the ones it wrote.
func TestCorruptReplicaFailsOver(t *testing.T) {
	r := newRig(t, 48, 16, 5*time.Second, nil)
	rem := r.remote(t)
	writeAll(t, rem, 48, 3)
	for e, reps := range r.vol.Stripes.Extents {
		first := reps[0]
		require.NoError(t, r.srv[first].Store.CorruptForTest(r.vol.Local[first], uint64(e*16+2)*pageid.Size+17)) // page 2 at one replica
		for _, id := range reps {
			require.NoError(t, r.srv[id].Store.CorruptForTest(r.vol.Local[id], uint64(e*16+5)*pageid.Size)) // page 5 at both
		}
	}
	got := make([]byte, pageid.Size)
	for i := range 48 {
		err := rem.ReadPage(context.Background(), pageid.MakeKey(7, uint64(i)), got)
		if i%16 == 5 {
			assert.ErrorIs(t, err, pageid.ErrCorrupt, "page %d is corrupt at every replica", i)
			continue
		}
		require.NoError(t, err, "page %d", i)
		require.Equal(t, page(3+byte(i)), got, "page %d", i)
	}
	assert.NotZero(t, rem.Failovers.Load())
}

package replica

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
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
// etcd: refusing to drop the last replica.
type mapDropper struct {
	mu     sync.Mutex
	maps   map[string]*cluster.Stripes
	refuse bool
}

func (d *mapDropper) DropReplica(_ context.Context, vol string, e int, node string) (cluster.Stripes, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.maps[vol]
	if d.refuse {
		return *s, assert.AnError
	}
	i := slices.Index(s.Extents[e], node)
	if i < 0 {
		return *s, nil
	}
	if len(s.Extents[e]) == 1 {
		return *s, cluster.ErrLastReplica
	}
	s.Extents[e] = slices.Delete(slices.Clone(s.Extents[e]), i, i+1)
	s.Epoch++
	return clone(*s), nil
}

func clone(s cluster.Stripes) cluster.Stripes {
	s.Extents = slices.Clone(s.Extents)
	for i := range s.Extents {
		s.Extents[i] = slices.Clone(s.Extents[i])
	}
	return s
}

// newRig places a volume of pages pages in extents of extentPages pages,
// two replicas each, round robin over nodes a, b, c; wrap, if set, puts a
// proxy in front of a node (a Gate).
func newRig(t *testing.T, pages, extentPages int, opTimeout time.Duration, wrap map[string]func(string) string) *rig {
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
		c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{OpTimeout: opTimeout, DialTimeout: time.Second})
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

func (r *rig) remote(t *testing.T) *Remote {
	rem, err := New(r.clients, []Volume{r.vol}, r.drops)
	require.NoError(t, err)
	return rem
}

// The contract every Remote keeps, over extents of 16 pages spread on
// three nodes.
func TestConformance(t *testing.T) {
	r := newRig(t, remotetest.Pages, 16, 5*time.Second, nil)
	remotetest.Run(t, r.remote(t), r.vol.ID, remotetest.Capabilities{PagesReader: true, Trimmer: true})
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
	var keys []pagestore.Key
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
	err := rem.WritePages(context.Background(), []pagestore.Key{pageid.MakeKey(7, 0)}, [][]byte{page(9)})
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
	assert.ErrorIs(t, err, memnode.ErrConnLost)
	assert.Contains(t, err.Error(), "every replica failed")
	err = rem.WritePages(context.Background(), []pagestore.Key{pageid.MakeKey(7, 3)}, [][]byte{page(9)})
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

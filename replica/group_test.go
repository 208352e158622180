package replica

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const groupExtent = 1 << 40

// groupRig is a rig (whose own volume is one extent at a and b), its
// Remote, and a group "fs.x." at nodes a and b recorded as "fs.x".
func groupRig(t *testing.T, opTimeout time.Duration) (*rig, *Remote, *Group) {
	t.Helper()
	r := newRig(t, 16, 16, opTimeout, nil)
	rem := r.remote(t)
	s := cluster.Stripes{Epoch: 1, ExtentBytes: groupExtent, Replicas: 2, Extents: [][]string{{"a", "b"}}}
	r.drops.mu.Lock()
	r.drops.maps["fs.x"] = ptr(s.Clone())
	r.drops.mu.Unlock()
	g, err := rem.OpenGroup(context.Background(), "fs.x", "fs.x.", s)
	require.NoError(t, err)
	return r, rem, g
}

func writeVol(t *testing.T, rem *Remote, vol uint16, pages int, seed byte) {
	t.Helper()
	for i := range pages {
		require.NoError(t, rem.WritePages(context.Background(), []pageid.Key{pageid.MakeKey(vol, uint64(i))}, [][]byte{page(seed + byte(i))}))
	}
}

func readVol(t *testing.T, rem *Remote, vol uint16, pages int, seed byte) {
	t.Helper()
	got := make([]byte, pageid.Size)
	for i := range pages {
		require.NoError(t, rem.ReadPage(context.Background(), pageid.MakeKey(vol, uint64(i)), got), "volume %d page %d", vol, i)
		require.Equal(t, page(seed+byte(i)), got, "volume %d page %d", vol, i)
	}
}

// A group's volumes are made, written, listed and freed at both of its
// nodes under ids this host hands out, and found again by a new host.
func TestGroupVolumes(t *testing.T) {
	r, rem, g := groupRig(t, 5*time.Second)
	ctx := context.Background()
	one, err := g.Create(ctx, "fs.x.1", groupExtent)
	require.NoError(t, err)
	assert.NotEqual(t, r.vol.ID, one.ID)
	_, err = g.Create(ctx, "fs.x.1", groupExtent)
	assert.ErrorIs(t, err, pageid.ErrExists)
	_, err = r.clients["b"].Create(ctx, "fs.x.half", 1<<20) // a create undone half-way
	require.NoError(t, err)
	require.NoError(t, g.Delete(ctx, "fs.x.half"), "not served, freed where it is")
	_, err = g.Create(ctx, "fs.x.half", groupExtent)
	require.NoError(t, err)
	_, err = g.Create(ctx, "other", 1<<20)
	assert.Error(t, err, "not of the group")
	two, err := g.OpenOrCreate(ctx, "fs.x.2", groupExtent)
	require.NoError(t, err)
	writeVol(t, rem, one.ID, 4, 1)
	writeVol(t, rem, two.ID, 4, 9)
	for _, id := range []string{"a", "b"} {
		infos, err := r.clients[id].List(ctx)
		require.NoError(t, err)
		var names []string
		for _, i := range infos {
			names = append(names, i.Name)
		}
		assert.Subset(t, names, []string{"fs.x.1", "fs.x.2"}, "node %s", id)
		assert.NotContains(t, names, "other")
	}
	require.NoError(t, g.Delete(ctx, "fs.x.half"))
	list, err := g.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, 2)
	for _, v := range list {
		assert.Equal(t, uint64(memnode.ChunkSize), v.Stored, "%s: one chunk written", v.Name)
	}
	require.NoError(t, g.Delete(ctx, "fs.x.2"))
	assert.ErrorIs(t, g.Delete(ctx, "fs.x.2"), pageid.ErrNoVolume)
	assert.ErrorIs(t, rem.ReadPage(ctx, pageid.MakeKey(two.ID, 0), make([]byte, pageid.Size)), pageid.ErrNoVolume)

	// Another host: the group is what the nodes hold.
	rem2 := r.remote(t)
	g2, err := rem2.OpenGroup(ctx, "fs.x", "fs.x.", *r.drops.maps["fs.x"])
	require.NoError(t, err)
	list, err = g2.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "fs.x.1", list[0].Name)
	readVol(t, rem2, list[0].ID, 4, 1)
}

// A node that cannot make a volume is dropped from the group, as one
// that missed a write: the create succeeds at the other.
func TestGroupCreateDropsAFailedNode(t *testing.T) {
	r, rem, g := groupRig(t, time.Second)
	r.srv["b"].Close()
	v, err := g.Create(context.Background(), "fs.x.1", groupExtent)
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, g.Stripes().Extents[0])
	assert.True(t, g.Degraded())
	writeVol(t, rem, v.ID, 2, 1)
	readVol(t, rem, v.ID, 2, 1)
}

// A repair copies the group to c while one volume is written, others
// are made and freed: afterwards c alone serves every page last written
// and every volume made, holds no volume freed and none of the group's
// stale volumes it had; only the ranges written reports are read.
func TestGroupRepairUnderWrites(t *testing.T) {
	r, rem, g := groupRig(t, 5*time.Second)
	ctx := context.Background()
	hot, err := g.Create(ctx, "fs.x.hot", groupExtent)
	require.NoError(t, err)
	cold, err := g.Create(ctx, "fs.x.cold", groupExtent)
	require.NoError(t, err)
	gone, err := g.Create(ctx, "fs.x.gone", groupExtent)
	require.NoError(t, err)
	for _, v := range []pageid.VolumeInfo{hot, cold, gone} {
		require.NoError(t, rem.Fence(ctx, v.ID, 5))
	}
	writeVol(t, rem, hot.ID, 8, 1)
	writeVol(t, rem, cold.ID, 8, 50)
	_, err = r.clients["c"].Create(ctx, "fs.x.stale", 1<<20) // from an earlier life of c
	require.NoError(t, err)

	r.srv["b"].Close()
	require.NoError(t, rem.DropNode(ctx, "b"))
	require.True(t, g.Degraded())

	var mu sync.Mutex
	last := map[int][]byte{}
	var made []pageid.VolumeInfo
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var copies progress
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p, data := i%8, page(byte(100+i))
			if err := rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(hot.ID, uint64(p))}, [][]byte{data}); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			last[p] = data
			mu.Unlock()
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v, err := g.Create(ctx, fmt.Sprintf("fs.x.new%d", i), groupExtent)
			if err != nil {
				t.Error(err)
				return
			}
			writeVol(t, rem, v.ID, 1, byte(i))
			mu.Lock()
			made = append(made, v)
			mu.Unlock()
			copies.await(1) // one new volume per chunk copied
		}
	})
	deleted := make(chan error, 1)
	var once sync.Once
	late := page(222)
	rem.copied = func(vol uint16) {
		// Mid-copy, maybe of that very volume: the delete waits for the
		// chunk.
		once.Do(func() { go func() { deleted <- g.Delete(ctx, "fs.x.gone") }() })
		if vol == hot.ID {
			// A write between the chunk's read and its copy: it must not
			// be overwritten at c by the older bytes read.
			go rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(hot.ID, 15)}, [][]byte{late})
		}
		// The copy of a chunk holds its lock: writes to it wait, and a
		// slow copy is what lets them pile up. A span of time is the point.
		time.Sleep(5 * time.Millisecond)
		copies.n.Add(1)
	}
	written := func(vol uint16, each func(off, n uint64)) {
		switch vol {
		case hot.ID:
			each(0, 16*pageid.Size)
		case cold.ID, gone.ID:
			each(0, 8*pageid.Size)
		default: // made meanwhile: written to before the join, maybe
			each(0, pageid.Size)
		}
	}
	require.NoError(t, g.Repair(ctx, "c", r.clients["c"], nil, written))
	copies.done.Store(true)
	close(stop)
	wg.Wait()
	require.NoError(t, <-deleted)
	assert.Equal(t, []string{"a", "c"}, g.Stripes().Extents[0])
	assert.False(t, g.Degraded())
	assert.LessOrEqual(t, rem.RepairBytes.Load(), uint64((32+len(made))*pageid.Size), "only what written reported")

	r.srv["a"].Close()
	// The rig's own volume had its last replica at a: that is refused.
	assert.ErrorIs(t, rem.DropNode(ctx, "a"), cluster.ErrLastReplica)
	assert.Equal(t, []string{"c"}, g.Stripes().Extents[0])
	got := make([]byte, pageid.Size)
	for p := range 8 {
		require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(hot.ID, uint64(p)), got), "page %d", p)
		want, ok := last[p]
		if !ok {
			want = page(1 + byte(p))
		}
		assert.Equal(t, want, got, "page %d", p)
	}
	require.NoError(t, rem.ReadPage(ctx, pageid.MakeKey(hot.ID, 15), got))
	assert.Equal(t, late, got, "the write made during the chunk's copy")
	readVol(t, rem, cold.ID, 8, 50)
	require.NotEmpty(t, made)
	for i, v := range made {
		readVol(t, rem, v.ID, 1, byte(i))
	}
	infos, err := r.clients["c"].List(ctx)
	require.NoError(t, err)
	for _, info := range infos {
		assert.NotContains(t, []string{"fs.x.stale", "fs.x.gone"}, info.Name)
		if info.Name == "fs.x.hot" {
			fenced, err := r.srv["c"].Store.Fence(info.ID)
			require.NoError(t, err)
			assert.Equal(t, uint64(5), fenced, "the copy has the volume's token")
		}
	}
}

// Moving the group off a node: copied to the new one, the old one
// dropped and its copies freed.
func TestGroupMove(t *testing.T) {
	r, rem, g := groupRig(t, 5*time.Second)
	ctx := context.Background()
	v, err := g.Create(ctx, "fs.x.1", groupExtent)
	require.NoError(t, err)
	writeVol(t, rem, v.ID, 4, 1)
	require.Error(t, g.Move(ctx, "b", "c", r.clients["c"], nil, nil), "no ranges to copy")
	require.NoError(t, g.Move(ctx, "b", "c", r.clients["c"], nil, func(_ uint16, each func(off, n uint64)) { each(0, 4*pageid.Size) }))
	assert.Equal(t, []string{"a", "c"}, g.Stripes().Extents[0])
	infos, err := r.clients["b"].List(ctx)
	require.NoError(t, err)
	for _, i := range infos {
		assert.NotEqual(t, "fs.x.1", i.Name, "freed at b")
	}
	r.srv["a"].Close()
	require.NoError(t, rem.DropNode(ctx, "a"))
	readVol(t, rem, v.ID, 4, 1)
}

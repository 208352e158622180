package replica

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/internal/testetcd"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// TestTenderRepairsWhatALostNodeHeld: the control plane reports node a
// down; the tender drops it from the volume's map, copies each extent it
// held to the node up that lacks it, one at a time, and records the new
// map in etcd; every page then reads back from each of its two replicas.
func TestTenderRepairsWhatALostNodeHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	ctx := context.Background()
	etcd := testetcd.Start(t, 1, "http")
	cli, err := cluster.Dial(ctx, cluster.Access{Endpoints: etcd.Clients})
	require.NoError(t, err)
	defer cli.Close()
	const name = "tend"

	r := newRig(t, 64, 16, 5*time.Second, nil) // 4 extents, each on 2 of a, b and c
	regs := map[string]*cluster.Registration{}
	for _, id := range []string{"a", "b", "c"} {
		// Persistent: a node that stops stays listed, down.
		reg, err := cluster.Register(ctx, cli, cluster.NodeRecord{ID: id, Addr: r.addr[id]}, cluster.RegisterOptions{Cluster: name, Persistent: true})
		require.NoError(t, err)
		t.Cleanup(func() { reg.Close() })
		regs[id] = reg
	}
	s := r.vol.Stripes.Clone()
	rec, err := Reserve(ctx, cli, name, cluster.VolumeRecord{Name: r.vol.Name, Size: r.vol.Size, Stripes: &s}, nil)
	require.NoError(t, err)
	rem, err := New(r.clients, []Volume{r.vol}, EtcdControl{Client: cli, Cluster: name})
	require.NoError(t, err)
	writeAll(t, rem, 64, 3)

	held := 0
	for _, reps := range s.Extents {
		if slices.Contains(reps, "a") {
			held++
		}
	}
	require.Positive(t, held)
	require.NoError(t, regs["a"].Close())
	r.srv["a"].Close()

	var dialled int
	tend := &Tender{Etcd: cli, Cluster: name, Remote: rem, RepairRate: 0,
		Volumes: []pageid.VolumeInfo{{ID: r.vol.ID, Name: rec.Name, Size: rec.Size}},
		Dial: func(ctx context.Context, addr string) (*memnode.Client, error) {
			dialled++ // dialled once per target node, kept after
			return memnode.Dial(ctx, addr, memnode.ClientOptions{OpTimeout: 5 * time.Second})
		}}
	stop := tend.Run(ctx)
	defer stop()
	require.Eventually(t, func() bool {
		got, err := cluster.GetVolume(ctx, cli, name, rec.Name)
		if err != nil || got.Stripes == nil {
			return false
		}
		deg, lost := got.Stripes.Degraded()
		return deg == 0 && lost == 0 && !slices.Contains(got.Stripes.Nodes(), "a")
	}, 30*time.Second, 50*time.Millisecond, "the map in etcd heals without a")
	stop()
	assert.Positive(t, dialled)

	got, err := cluster.GetVolume(ctx, cli, name, rec.Name)
	require.NoError(t, err)
	buf := make([]byte, pageid.Size)
	for e, reps := range got.Stripes.Extents {
		require.Len(t, reps, 2, "extent %d", e)
		for _, id := range reps {
			// Each replica alone, through a Remote that knows no other.
			one := r.vol
			one.Stripes = got.Stripes.Clone()
			for i := range one.Stripes.Extents {
				one.Stripes.Extents[i] = []string{id}
			}
			solo, err := New(map[string]*memnode.Client{id: r.clients[id]}, []Volume{one}, nil)
			require.NoError(t, err)
			for p := e * 16; p < (e+1)*16; p++ {
				require.NoError(t, solo.ReadPage(ctx, pageid.MakeKey(r.vol.ID, uint64(p)), buf), "page %d at %s", p, id)
				require.Equal(t, page(3+byte(p)), buf, "page %d at %s", p, id)
			}
		}
	}
}

// TestTenderRefreshAsksEtcdOnce: the tender's look for newer stripe maps
// is one request however many volumes the host serves (it was one per
// volume a second: an idle host of 256 volumes sent etcd 218 a second).
func TestTenderRefreshAsksEtcdOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	ctx := context.Background()
	etcd := testetcd.Start(t, 1, "http")
	cli, err := cluster.Dial(ctx, cluster.Access{Endpoints: etcd.Clients})
	require.NoError(t, err)
	defer cli.Close()
	const name = "refresh"
	rem, err := New(map[string]*memnode.Client{}, nil, nil) // serves none of them: Install ignores each
	require.NoError(t, err)
	tend := &Tender{Etcd: cli, Cluster: name, Remote: rem}
	for i := range 64 {
		s := cluster.Stripes{Epoch: 1, ExtentBytes: 1 << 20, Replicas: 1, Extents: [][]string{{"a"}}}
		rec, err := Reserve(ctx, cli, name, cluster.VolumeRecord{Name: fmt.Sprintf("v%d", i), Size: 1 << 20, Stripes: &s}, nil)
		require.NoError(t, err)
		tend.Volumes = append(tend.Volumes, pageid.VolumeInfo{ID: rec.ID, Name: rec.Name, Size: rec.Size})
	}
	received := func() float64 {
		mfs, err := scrape.Families(ctx, etcd.Clients[0]+"/metrics")
		require.NoError(t, err)
		return scrape.Sum(mfs, "grpc_server_msg_received_total")
	}
	before := received()
	tend.refresh(ctx)
	assert.LessOrEqual(t, received()-before, 2.0, "gRPC requests etcd received for one refresh of 64 volumes")
}

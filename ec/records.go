package ec

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
)

// EtcdControl is Control over the control plane's records.
type EtcdControl struct {
	Client  *clientv3.Client
	Cluster string
}

// DropShard implements Control.
func (c EtcdControl) DropShard(ctx context.Context, vol string, g, s int) (cluster.Coded, error) {
	return cluster.DropShard(ctx, c.Client, c.Cluster, vol, g, s)
}

// Create places an erasure-coded volume of size bytes over the nodes up
// and not draining (each group's K+M shards on distinct nodes, starting
// at a random one), records it in the control plane, and creates its
// volume at every node of the placement (dial returns a node's client by
// id, or nil if it cannot reach it). A node's --capacity is respected: the
// volume is refused, naming each node's room, when its shards would not
// fit. On any failure the record and the volumes made are removed.
func Create(ctx context.Context, cli *clientv3.Client, clusterName string, nodes []cluster.Node, name string, size uint64, sch cluster.Scheme, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	var up []cluster.Node
	for _, n := range nodes {
		if n.Up && !n.Draining {
			up = append(up, n)
		}
	}
	rand.Shuffle(len(up), func(i, j int) { up[i], up[j] = up[j], up[i] })
	ids := make([]string, len(up))
	for i, n := range up {
		ids[i] = n.ID
	}
	p, err := cluster.PlaceCoded(sch, size, cluster.DefaultExtentBytes, ids)
	if err != nil {
		return cluster.VolumeRecord{}, fmt.Errorf("%w (%d up and not draining)", err, len(up))
	}
	if err := fits(p, up); err != nil {
		return cluster.VolumeRecord{}, err
	}
	return replica.Reserve(ctx, cli, clusterName, cluster.VolumeRecord{Name: name, Size: size, EC: &p}, dial)
}

// fits checks that each node has room for the shards placed on it.
func fits(p cluster.Coded, up []cluster.Node) error {
	placed := map[string]uint64{}
	for g, row := range p.Groups {
		for s, id := range row {
			if !p.Virtual(g, s) {
				placed[id] += p.ExtentBytes
			}
		}
	}
	var short []string
	for _, n := range up {
		if n.Capacity > 0 && n.Stored+placed[n.ID] > n.Capacity {
			short = append(short, fmt.Sprintf("%s needs %s, has %s of %s free", n.ID, units.FormatSize(placed[n.ID]),
				units.FormatSize(n.Capacity-min(n.Capacity, n.Stored)), units.FormatSize(n.Capacity)))
		}
	}
	if len(short) > 0 {
		return fmt.Errorf("%w: the shards of erasure code %s do not fit: %s; add a memory node or raise a node's capacity", cluster.ErrNoNode, p.Scheme, strings.Join(short, "; "))
	}
	return nil
}

// SetShard implements Control.
func (c EtcdControl) SetShard(ctx context.Context, vol string, g, s int, node string) (cluster.Coded, error) {
	return cluster.SetShard(ctx, c.Client, c.Cluster, vol, g, s, node)
}

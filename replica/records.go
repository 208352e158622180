package replica

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// A replicated volume's life in the control plane and at its nodes:
// placed and created, grown. Its stripe map is then changed by a Remote's
// Control and carried out by a Tender.

// Create places a replicated volume of size bytes over the
// nodes up (replicas copies of each extent, fewer if fewer nodes are up),
// records it in the control plane, and creates its copy at every node of
// its map (dial returns a node's client by id, or nil if it cannot reach
// it). A volume of that name is cluster.ErrVolumeExists; on any failure
// the record and the copies made are removed.
func Create(ctx context.Context, cli *clientv3.Client, clusterName string, nodes []cluster.Node, name string, size uint64, replicas int, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	stripes, err := cluster.PlaceStripes(nodes, size, cluster.DefaultExtentBytes, replicas, rand.IntN)
	if err != nil {
		return cluster.VolumeRecord{}, err
	}
	return Reserve(ctx, cli, clusterName, cluster.VolumeRecord{Name: name, Size: size, Stripes: &stripes}, dial)
}

// Reserve records volume rec placed over many nodes (name, size, and
// stripes or an erasure-coded placement; the id is handed out here) and,
// unless dial is nil, creates its volume at every node of the placement;
// on a failure the record and the volumes made are removed.
func Reserve(ctx context.Context, cli *clientv3.Client, clusterName string, rec cluster.VolumeRecord, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	name, size := rec.Name, rec.Size
	// A copy at every node of the map, sparse: a node stores only the
	// extents placed on it.
	var copies []string
	if dial != nil {
		copies = rec.Nodes()
	}
	nodeBytes := rec.NodeBytes()
	id, err := cluster.NextVolumeID(ctx, cli, clusterName)
	if err != nil {
		return cluster.VolumeRecord{}, err
	}
	rec.ID, rec.PageSize = id, pageid.Size
	rec, err = cluster.ReserveVolume(ctx, cli, clusterName, rec)
	if err != nil {
		return rec, err
	}
	var made []*memnode.Client
	for _, nid := range copies {
		c := dial(nid)
		if c == nil {
			err = fmt.Errorf("node %s: unreachable", nid)
		} else if _, err = c.Create(ctx, name, nodeBytes); err != nil {
			err = fmt.Errorf("node %s: %w", nid, err)
		}
		if err != nil {
			for _, c := range made {
				c.Delete(ctx, name)
			}
			return rec, errors.Join(err, cluster.DropVolume(ctx, cli, clusterName, rec))
		}
		made = append(made, c)
	}
	return cluster.VolumeCreated(ctx, cli, clusterName, rec, id, size)
}

// Resize grows the replicated volume of rec (marked resizing,
// so no host serves it) to size bytes: the extents added are placed as at
// creation, every node of the longer map that is up gets its copy grown
// (or made) to the new size, and the record goes back to ready with the
// new map and size. A node of the map that is down keeps its smaller
// copy: it holds none of the new extents, and a repair onto it grows its
// copy first. Cut short, the record stays resizing with the old map, and
// running it again finishes it (copies already grown stay so).
func Resize(ctx context.Context, cli *clientv3.Client, clusterName string, nodes []cluster.Node, rec cluster.VolumeRecord, size uint64, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	if rec.Stripes == nil {
		return rec, fmt.Errorf("volume %s is not replicated", rec.Name)
	}
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	s := rec.Stripes.Clone()
	if want := int((size + s.ExtentBytes - 1) / s.ExtentBytes); want > len(s.Extents) {
		add, err := cluster.PlaceStripes(nodes, uint64(want-len(s.Extents))*s.ExtentBytes, s.ExtentBytes, s.Replicas, rand.IntN)
		if err != nil {
			return rec, err
		}
		s.Extents = append(s.Extents, add.Extents...)
		s.Epoch++
	}
	up := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		up[n.ID] = n.Up
	}
	for _, id := range s.Nodes() {
		if !up[id] {
			continue
		}
		c := dial(id)
		if c == nil {
			return rec, fmt.Errorf("node %s: unreachable", id)
		}
		info, err := c.OpenOrCreate(ctx, rec.Name, size)
		if err == nil && info.Size < size {
			_, err = c.Resize(ctx, rec.Name, size)
		}
		if err != nil {
			return rec, fmt.Errorf("node %s: %w", id, err)
		}
	}
	rec.Stripes = &s
	return cluster.VolumeResized(ctx, cli, clusterName, rec, size)
}

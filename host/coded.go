package host

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
)

// openCoded marks coded volume v open for writing in the control plane
// once this host holds it. If the last holder left it open (it stopped
// without closing it), the parity of every row is re-encoded first: a row
// it was writing may be torn. The function returned marks the volume
// closed again, once every dirty page is written back.
func (h *Host) openCoded(ctx context.Context, cli *clientv3.Client, cfg Config, v pageid.VolumeInfo) (closed func(context.Context) error, err error) {
	was, err := cluster.SetOpen(ctx, cli, cfg.Cluster, v.Name, true)
	if err != nil {
		return nil, fmt.Errorf("host: volume %q: marking it open: %w", v.Name, err)
	}
	if was {
		start := time.Now()
		n, err := h.Coded.Resync(ctx, v.ID)
		if err != nil {
			return nil, fmt.Errorf("host: volume %q was left open by a host that stopped; re-encoding its parity failed: %w", v.Name, err)
		}
		cfg.Log.Warn(fmt.Sprintf("ec: volume %s was left open by a host that stopped without closing it: parity re-encoded from the data in %v, %d runs of 256 KiB rewritten",
			v.Name, time.Since(start).Round(time.Millisecond), n))
	}
	return func(ctx context.Context) error {
		if h.Store != nil && h.Store.Stats().DirtyPages > 0 {
			return nil // not every write is back: the next host re-encodes
		}
		_, err := cluster.SetOpen(ctx, cli, cfg.Cluster, v.Name, false)
		return err
	}, nil
}

// codedTendEvery is how often the host looks for coded shards to drop or
// rebuild.
const codedTendEvery = 2 * time.Second

// tendCoded keeps the host's erasure-coded volumes whole until ctx ends:
// the shards of a node the control plane sees down are dropped (reads go
// straight to decoding), and each lost shard is rebuilt, one at a time,
// on a node up that holds no other shard of its group, at most
// cfg.RepairRate bytes a second. It returns a function that stops it and
// waits.
func (h *Host) tendCoded(ctx context.Context, cfg Config, cli *clientv3.Client, vols []pageid.VolumeInfo, dial func(id string) *memnode.Client) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		down := map[string]bool{}
		t := time.NewTicker(codedTendEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster)
			if err != nil {
				continue
			}
			for _, n := range nodes {
				switch {
				case n.Up:
					delete(down, n.ID)
				case !down[n.ID]:
					if err := h.Coded.DropNode(ctx, n.ID); err != nil {
						cfg.Log.Error("ec: memory node down; its shards could not be dropped", "node", n.ID, "err", err)
						continue
					}
					down[n.ID] = true
					cfg.Log.Warn("ec: memory node down; its shards are dropped and decoded until rebuilt", "node", n.ID, "addr", n.Addr)
				}
			}
			for _, v := range vols {
				h.rebuildCoded(ctx, cfg, nodes, v, dial)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// rebuildCoded rebuilds the lost shards of coded volume v, one at a time,
// until one cannot be (the next round tries again).
func (h *Host) rebuildCoded(ctx context.Context, cfg Config, nodes []cluster.Node, v pageid.VolumeInfo, dial func(id string) *memnode.Client) {
	for _, gs := range h.Coded.Lost(v.ID) {
		g, s := gs[0], gs[1]
		p, _ := h.Coded.Placement(v.ID)
		var fit []string
		for _, n := range nodes {
			if n.Up && !n.Draining && !slices.Contains(p.Groups[g], n.ID) {
				fit = append(fit, n.ID)
			}
		}
		if len(fit) == 0 {
			return // no node to rebuild on: the group stays degraded
		}
		target := fit[rand.IntN(len(fit))]
		c := dial(target)
		if c == nil {
			continue
		}
		info, err := c.OpenOrCreate(ctx, v.Name, p.NodeBytes())
		if err == nil {
			err = h.Coded.AddNode(ctx, target, c, v.ID, info.ID)
		}
		if err == nil {
			start := time.Now()
			err = h.Coded.Repair(ctx, v.ID, g, s, target, replica.Pacer(cfg.RepairRate))
			if err == nil {
				q, _ := h.Coded.Placement(v.ID)
				deg, _ := q.Health()
				cfg.Log.Info(fmt.Sprintf("ec: volume %s: shard %d of group %d rebuilt on node %s in %v; %d groups degraded", v.Name, s, g, target, time.Since(start).Round(time.Millisecond), deg))
				continue
			}
		}
		if ctx.Err() == nil {
			cfg.Log.Warn("ec: rebuilding a shard failed; retried", "volume", v.Name, "group", g, "shard", s, "node", target, "err", err)
		}
		return
	}
}

var _ ec.Node = (*memnode.Client)(nil)

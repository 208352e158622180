package deploy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/replica"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// startReplicated is StartHost for volumes striped and replicated over
// the cluster's memory nodes (cfg.Replicas > 0): it places a volume the
// control plane does not know yet, connects to every node holding one of
// its extents, and serves it through a replica.Remote whose dropped
// replicas are recorded in etcd.
func startReplicated(ctx context.Context, cfg HostConfig) (_ *Host, err error) {
	switch {
	case !cfg.Etcd.Enabled():
		return nil, errors.New("host: replicated volumes (--replicas) need the control plane (--etcd)")
	case cfg.Mount != "":
		return nil, errors.New("host: a FUSE mount over replicated volumes is not there yet: use --mount '' with --replicas")
	case cfg.DPU != "" && cfg.DPU != "none", cfg.Prefetch != "" && cfg.Prefetch != "none":
		return nil, errors.New("host: the DPU agent and prefetchers do not read replicated volumes yet: use --dpu none with --replicas")
	}
	h := &Host{done: make(chan error, 1)}
	defer func() {
		if err != nil {
			h.Close(context.WithoutCancel(ctx))
		}
	}()
	cli, err := cluster.Dial(ctx, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.onClose(cli.Close)
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: cfg.OpTimeout, DialTimeout: 3 * time.Second}
	if copt.TLS, err = memnodeTLS(cfg.MemnodeTLS); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	clients := make(map[string]*memnode.Client)
	// dial connects to node id once; a node down or unreachable is left
	// out, and its replicas are dropped when the volume is fenced.
	dial := func(id string) *memnode.Client {
		if c, ok := clients[id]; ok {
			return c
		}
		for _, n := range nodes {
			if n.ID != id || !n.Up {
				continue
			}
			c, err := memnode.Dial(ctx, n.Addr, copt)
			if err != nil {
				cfg.Log.Warn("host: memory node unreachable; its replicas will be dropped", "node", id, "addr", n.Addr, "err", err)
				clients[id] = nil
				return nil
			}
			h.onClose(c.Close)
			clients[id] = c
			return c
		}
		clients[id] = nil
		return nil
	}
	var vols []replica.Volume
	for _, vs := range cfg.Volumes {
		rec, err := replicatedVolume(ctx, cli, cfg, nodes, vs, dial)
		if err != nil {
			return nil, fmt.Errorf("host: volume %q: %w", vs.Name, err)
		}
		v := replica.Volume{ID: rec.ID, Name: rec.Name, Size: rec.Size, Stripes: *rec.Stripes, Local: map[string]uint16{}}
		for _, id := range rec.Stripes.Nodes() {
			c := dial(id)
			if c == nil {
				continue
			}
			info, err := c.Open(ctx, rec.Name)
			if err != nil {
				cfg.Log.Warn("host: a replica's node does not have the volume; its replicas will be dropped", "volume", rec.Name, "node", id, "err", err)
				continue
			}
			v.Local[id] = info.ID
		}
		vols = append(vols, v)
		h.Volumes = append(h.Volumes, memnode.VolumeInfo{ID: rec.ID, Size: rec.Size, Name: rec.Name})
	}
	reach := make(map[string]*memnode.Client)
	for id, c := range clients {
		if c != nil {
			reach[id] = c
		}
	}
	if h.Replicated, err = replica.New(reach, vols, etcdDropper{cli: cli, cluster: cfg.Cluster}); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	opt := pagestore.Options{CacheBytes: cfg.CacheBytes, Policy: cfg.Policy, RetryFor: cfg.OpTimeout, Log: cfg.Log}
	st, err := pagestore.New(h.Replicated, opt)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.useStore(ctx, cfg, st)
	if err := h.leaseVolumes(ctx, cfg); err != nil {
		return nil, err
	}
	for _, v := range h.Volumes {
		st.AddVolume(v)
	}
	stop := watchNodes(ctx, cli, cfg, h.Replicated)
	h.onClose(func() error { stop(); return nil })
	if err := h.serve(ctx, cfg); err != nil {
		return nil, err
	}
	return h, nil
}

// nodeWatchEvery is how often a host of replicated volumes looks for
// memory nodes the control plane says are down.
const nodeWatchEvery = time.Second

// watchNodes drops from the stripe maps every node the control plane
// reports down (its lease expired: SIGKILL, power-off, a partition from
// etcd), so that nothing is read from it again: if it returns, its copy
// may be stale, or a volatile node may come back empty with its volume
// ids re-used. It returns a stop function.
func watchNodes(ctx context.Context, cli *clientv3.Client, cfg HostConfig, r *replica.Remote) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(nodeWatchEvery)
		defer t.Stop()
		dropped := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster)
			if err != nil {
				continue // etcd unreachable: the session's doubt handles it
			}
			for _, n := range nodes {
				if n.Up {
					delete(dropped, n.ID) // back: it holds nothing until repair copies to it
					continue
				}
				if dropped[n.ID] {
					continue
				}
				if err := r.DropNode(ctx, n.ID); err != nil {
					cfg.Log.Error("host: memory node down; some extents had no other replica", "node", n.ID, "err", err)
				} else {
					cfg.Log.Warn("host: memory node down; its replicas are dropped", "node", n.ID, "addr", n.Addr)
				}
				dropped[n.ID] = true
			}
		}
	}()
	return func() { cancel(); <-done }
}

// replicatedVolume returns the record of volume vs, placing it over the
// nodes up and creating its copies at them if the control plane has no
// record of it.
func replicatedVolume(ctx context.Context, cli *clientv3.Client, cfg HostConfig, nodes []cluster.Node, vs VolumeSpec, dial func(string) *memnode.Client) (cluster.VolumeRecord, error) {
	rec, err := cluster.GetVolume(ctx, cli, cfg.Cluster, vs.Name)
	switch {
	case err == nil && rec.Stripes == nil:
		return rec, fmt.Errorf("it lives on one memory node (%s), not replicated: serve it without --replicas", rec.NodeAddr)
	case err == nil && rec.State != cluster.VolumeReady:
		return rec, fmt.Errorf("it is %s (pd3 volume): not serving it", rec.State)
	case err == nil:
		return rec, nil
	case !errors.Is(err, cluster.ErrNoVolume):
		return rec, err
	}
	size := (vs.Size + pagestore.PageSize - 1) &^ (pagestore.PageSize - 1)
	stripes, err := cluster.PlaceStripes(nodes, size, cluster.DefaultExtentBytes, cfg.Replicas, rand.IntN)
	if err != nil {
		return rec, err
	}
	id, err := cluster.NextVolumeID(ctx, cli, cfg.Cluster)
	if err != nil {
		return rec, err
	}
	rec, err = cluster.ReserveVolume(ctx, cli, cfg.Cluster, cluster.VolumeRecord{Name: vs.Name, ID: id, Size: size,
		PageSize: pagestore.PageSize, Stripes: &stripes})
	if errors.Is(err, cluster.ErrVolumeExists) {
		return replicatedVolume(ctx, cli, cfg, nodes, vs, dial) // another host placed it first
	}
	if err != nil {
		return rec, err
	}
	// A copy at every node of the map, sparse: a node stores only the
	// extents placed on it.
	var made []*memnode.Client
	for _, nid := range stripes.Nodes() {
		c := dial(nid)
		if c == nil {
			err = fmt.Errorf("node %s: unreachable", nid)
		} else if _, err = c.Create(ctx, vs.Name, size); err != nil {
			err = fmt.Errorf("node %s: %w", nid, err)
		}
		if err != nil {
			for _, c := range made {
				c.Delete(ctx, vs.Name)
			}
			return rec, errors.Join(err, cluster.DropVolume(ctx, cli, cfg.Cluster, rec))
		}
		made = append(made, c)
	}
	rec, err = cluster.VolumeCreated(ctx, cli, cfg.Cluster, rec, id, size)
	if err == nil {
		deg, _ := stripes.Degraded()
		cfg.Log.Info(fmt.Sprintf("volume %s placed: %d extents of %d MiB over %d nodes, %d replicas each",
			vs.Name, len(stripes.Extents), stripes.ExtentBytes>>20, len(stripes.Nodes()), stripes.Replicas), "degraded", deg)
	}
	return rec, err
}

// etcdDropper records dropped replicas in the control plane.
type etcdDropper struct {
	cli     *clientv3.Client
	cluster string
}

func (d etcdDropper) DropReplica(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.DropReplica(ctx, d.cli, d.cluster, vol, extent, node)
}

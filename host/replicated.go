package host

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

var (
	_ dpu.Conn = (*replica.Remote)(nil)
	_ dpu.Conn = (*ec.Remote)(nil)
)

// startReplicated is Start for volumes striped and replicated over
// the cluster's memory nodes (cfg.Replicas > 0): it places a volume the
// control plane does not know yet, connects to every node holding one of
// its extents, and serves it through a replica.Remote whose dropped
// replicas are recorded in etcd.
func startReplicated(ctx context.Context, cfg Config) (_ *Host, err error) {
	h := &Host{busy: new(sockio.Busy), cork: new(pipeline.Cork), done: make(chan error, 1)}
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
	h.etcd = cli
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: cfg.OpTimeout, DialTimeout: 3 * time.Second, Busy: h.busy, Cork: h.cork}
	if copt.TLS, err = memnodeTLS(cfg.MemnodeTLS); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	clients := make(map[string]*memnode.Client)
	var dialMu sync.Mutex
	// dial connects to node id once; a node down or unreachable is left
	// out, and its replicas are dropped when the volume is fenced. The
	// volumes open side by side: one dial at a time.
	dial := func(id string) *memnode.Client {
		dialMu.Lock()
		defer dialMu.Unlock()
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
	h.dialNode = dial
	if cfg.Mount != "" {
		// Placed now, while the nodes are dialled; opened once the
		// filesystem is held (mount).
		if _, err := fsGroupRecord(ctx, cli, cfg, nodes); err != nil {
			return nil, fmt.Errorf("host: fs %q: %w", cfg.FSName, err)
		}
	}
	// Each volume is a few etcd and node round trips: opened side by
	// side (openWorkers at a time), in cfg's order in the end.
	recs := make([]cluster.VolumeRecord, len(cfg.Volumes))
	locals := make([]map[string]uint16, len(cfg.Volumes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(openWorkers)
	for i, vs := range cfg.Volumes {
		g.Go(func() error {
			rec, err := replicatedVolume(gctx, cli, cfg, nodes, vs, dial)
			if err != nil {
				return fmt.Errorf("host: volume %q: %w", vs.Name, err)
			}
			local := map[string]uint16{}
			for _, id := range rec.Nodes() {
				c := dial(id)
				if c == nil {
					continue
				}
				info, err := c.Open(gctx, rec.Name)
				if err != nil {
					cfg.Log.Warn("host: a node of the volume does not have it; what it holds will be dropped", "volume", rec.Name, "node", id, "err", err)
					continue
				}
				local[id] = info.ID
			}
			recs[i], locals[i] = rec, local
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var vols []replica.Volume
	var coded []ec.Volume
	for i, rec := range recs {
		h.Volumes = append(h.Volumes, pageid.VolumeInfo{ID: rec.ID, Size: rec.Size, Name: rec.Name})
		if rec.EC != nil {
			coded = append(coded, ec.Volume{ID: rec.ID, Name: rec.Name, Size: rec.Size, Placement: *rec.EC, Local: locals[i]})
		} else {
			vols = append(vols, replica.Volume{ID: rec.ID, Name: rec.Name, Size: rec.Size, Stripes: *rec.Stripes, Local: locals[i]})
		}
	}
	reach := make(map[string]*memnode.Client)
	for id, c := range clients {
		if c != nil {
			reach[id] = c
		}
	}
	if h.Replicated, err = replica.New(reach, vols, replica.EtcdControl{Client: cli, Cluster: cfg.Cluster}); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	remote := spread{rep: h.Replicated}
	if len(coded) > 0 {
		nodes := make(map[string]ec.Node, len(reach))
		for id, c := range reach {
			nodes[id] = c
		}
		if h.Coded, err = ec.New(nodes, coded, ec.EtcdControl{Client: cli, Cluster: cfg.Cluster}); err != nil {
			return nil, fmt.Errorf("host: %w", err)
		}
		remote.coded = h.Coded
	}
	// The engine's reads and write-backs go through the same node
	// connections as the host's: its ordering holds at every replica.
	st, err := h.openStore(ctx, cfg, remote, remote)
	if err != nil {
		return nil, err
	}
	if err := h.leaseVolumes(ctx, cfg); err != nil {
		return nil, err
	}
	for _, v := range h.Volumes {
		st.AddVolume(v)
	}
	if err := h.serve(ctx, cfg); err != nil {
		return nil, err
	}
	var tended, codedVols []pageid.VolumeInfo
	for _, v := range h.Volumes {
		if h.Coded != nil && h.Coded.Has(v.ID) {
			codedVols = append(codedVols, v)
		} else {
			tended = append(tended, v)
		}
	}
	t := &replica.Tender{Etcd: cli, Cluster: cfg.Cluster, Remote: h.Replicated, Volumes: tended, RepairRate: cfg.RepairRate, Log: cfg.Log,
		Dial: func(ctx context.Context, addr string) (*memnode.Client, error) { return memnode.Dial(ctx, addr, copt) }}
	if cfg.Mount != "" {
		if err := h.mount(ctx, cfg); err != nil {
			return nil, err
		}
		t.Groups = append(t.Groups, replica.TendedGroup{Group: h.group, Written: h.FS.Written})
	}
	if len(codedVols) > 0 {
		stop := h.tendCoded(ctx, cfg, cli, codedVols, dial)
		h.onClose(func() error { stop(); return nil })
	}
	if len(t.Volumes) == 0 && len(t.Groups) == 0 {
		return h, nil // nothing replicated to tend
	}
	stop := t.Run(ctx)
	h.onClose(func() error { stop(); return nil })
	return h, nil
}

// fsGroupRecord is the control plane's record of filesystem cfg.FSName's
// placement, made if there is none: every volume of the filesystem (its
// metadata and each file) lives at the same cfg.Replicas nodes, chosen by
// free memory as an extent is, in one map of one extent covering every
// offset a file can have. One record for the whole tree keeps creates and
// unlinks off the control plane, and a repair joins a node to the group
// once.
func fsGroupRecord(ctx context.Context, cli *clientv3.Client, cfg Config, nodes []cluster.Node) (cluster.VolumeRecord, error) {
	name := "fs." + cfg.FSName
	rec, err := cluster.GetVolume(ctx, cli, cfg.Cluster, name)
	switch {
	case err == nil:
		return rec, checkFSRecord(rec)
	case !errors.Is(err, cluster.ErrNoVolume):
		return rec, err
	}
	// Placed as one extent of a MiB: a node is fit if it has room for a
	// start, as the files grow wherever their group is.
	s, err := cluster.PlaceStripes(nodes, 1<<20, 1<<20, cfg.Replicas, rand.IntN)
	if err != nil {
		return rec, err
	}
	s.ExtentBytes = fs.MaxFileSize
	rec, err = replica.Reserve(ctx, cli, cfg.Cluster, cluster.VolumeRecord{Name: name, Size: fs.MaxFileSize, Stripes: &s, Filesystem: true}, nil)
	if errors.Is(err, cluster.ErrVolumeExists) {
		return fsGroupRecord(ctx, cli, cfg, nodes) // another host placed it first
	}
	if err == nil {
		cfg.Log.Info(fmt.Sprintf("filesystem %s placed over nodes %s", cfg.FSName, strings.Join(s.Extents[0], ", ")))
	}
	return rec, err
}

// checkFSRecord refuses a record that is not a filesystem's placement (a
// volume of that name).
func checkFSRecord(rec cluster.VolumeRecord) error {
	if !rec.Filesystem || rec.Stripes == nil || len(rec.Stripes.Extents) != 1 {
		return fmt.Errorf("the control plane's record %q is not a filesystem's placement", rec.Name)
	}
	return nil
}

// openGroup opens the filesystem's group of volumes once it is held: its
// record as it is now (a previous holder's repairs may have changed it),
// every node of it reached.
func (h *Host) openGroup(ctx context.Context, cfg Config) (*replica.Group, error) {
	rec, err := cluster.GetVolume(ctx, h.etcd, cfg.Cluster, "fs."+cfg.FSName)
	if err == nil {
		err = checkFSRecord(rec)
	}
	if err != nil {
		return nil, err
	}
	for _, id := range rec.Stripes.Nodes() {
		if c := h.dialNode(id); c != nil {
			h.Replicated.AddNode(id, c)
		}
	}
	return h.Replicated.OpenGroup(ctx, rec.Name, "fs."+cfg.FSName+".", *rec.Stripes)
}

// replicatedVolume returns the record of volume vs, placing it over the
// nodes up and creating its copies at them if the control plane has no
// record of it.
func replicatedVolume(ctx context.Context, cli *clientv3.Client, cfg Config, nodes []cluster.Node, vs VolumeSpec, dial func(string) *memnode.Client) (cluster.VolumeRecord, error) {
	rec, err := cluster.GetVolume(ctx, cli, cfg.Cluster, vs.Name)
	switch {
	case err == nil && rec.Filesystem:
		return rec, errors.New("it is a filesystem's placement, not a volume")
	case err == nil && rec.Stripes == nil && rec.EC == nil:
		return rec, &ConfigError{Field: "Memnode", Err: fmt.Errorf("volume %q lives on memory node %s alone, not striped: set Config.Memnode to %s (and Config.Replicas to 0) to serve it", vs.Name, rec.NodeAddr, rec.NodeAddr)}
	case err == nil && rec.State != cluster.VolumeReady:
		return rec, fmt.Errorf("it is %s (pd3 volume): not serving it", rec.State)
	case err == nil:
		return rec, nil
	case !errors.Is(err, cluster.ErrNoVolume):
		return rec, err
	}
	if cfg.EC.K > 0 {
		rec, err = ec.Create(ctx, cli, cfg.Cluster, nodes, vs.Name, vs.Size, cfg.EC, dial)
	} else {
		rec, err = replica.Create(ctx, cli, cfg.Cluster, nodes, vs.Name, vs.Size, cfg.Replicas, dial)
	}
	if errors.Is(err, cluster.ErrVolumeExists) {
		return replicatedVolume(ctx, cli, cfg, nodes, vs, dial) // another host placed it first
	}
	if err == nil && rec.EC != nil {
		p := rec.EC
		cfg.Log.Info(fmt.Sprintf("volume %s placed: erasure code %s, %s of %s extents of %d MiB over %s", vs.Name, p.Scheme,
			units.Count(len(p.Groups), "group", ""), p.Scheme, p.ExtentBytes>>20, units.Count(len(p.Nodes()), "node", "")))
	} else if err == nil {
		s := rec.Stripes
		cfg.Log.Info(fmt.Sprintf("volume %s placed: %s of %d MiB over %s, %s each", vs.Name, units.Count(len(s.Extents), "extent", ""),
			s.ExtentBytes>>20, units.Count(len(s.Nodes()), "node", ""), units.Count(s.Replicas, "replica", "")))
	}
	return rec, err
}

package host

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/replica"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ dpu.Conn = (*replica.Remote)(nil)

// startReplicated is Start for volumes striped and replicated over
// the cluster's memory nodes (cfg.Replicas > 0): it places a volume the
// control plane does not know yet, connects to every node holding one of
// its extents, and serves it through a replica.Remote whose dropped
// replicas are recorded in etcd.
func startReplicated(ctx context.Context, cfg Config) (_ *Host, err error) {
	h := &Host{busy: new(sockio.Busy), done: make(chan error, 1)}
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
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: cfg.OpTimeout, DialTimeout: 3 * time.Second, Busy: h.busy}
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
	h.dialNode = dial
	if cfg.Mount != "" {
		// Placed now, while the nodes are dialled; opened once the
		// filesystem is held (mount).
		if _, err := fsGroupRecord(ctx, cli, cfg, nodes); err != nil {
			return nil, fmt.Errorf("host: fs %q: %w", cfg.FSName, err)
		}
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
		h.Volumes = append(h.Volumes, pageid.VolumeInfo{ID: rec.ID, Size: rec.Size, Name: rec.Name})
	}
	reach := make(map[string]*memnode.Client)
	for id, c := range clients {
		if c != nil {
			reach[id] = c
		}
	}
	if h.Replicated, err = replica.New(reach, vols, etcdControl{cli: cli, cluster: cfg.Cluster}); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	opt := pagestore.Options{CacheBytes: cfg.CacheBytes, Policy: cfg.Policy, RetryFor: cfg.OpTimeout, Log: cfg.Log}
	// The engine's reads and write-backs go through the same node
	// connections as the host's: its ordering holds at every replica.
	remote, err := h.missPath(cfg, &opt, h.Replicated, h.Replicated)
	if err != nil {
		return nil, err
	}
	st, err := pagestore.New(remote, opt)
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
	if err := h.serve(ctx, cfg); err != nil {
		return nil, err
	}
	t := &tender{cli: cli, cfg: cfg, r: h.Replicated, vols: h.Volumes, dial: func(ctx context.Context, addr string) (*memnode.Client, error) {
		return memnode.Dial(ctx, addr, copt)
	}}
	if cfg.Mount != "" {
		if err := h.mount(ctx, cfg); err != nil {
			return nil, err
		}
		t.groups = append(t.groups, fsGroup{g: h.group, written: h.FS.Written})
	}
	stop := t.run(ctx)
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
	rec, err = reserveReplicated(ctx, cli, cfg.Cluster, cluster.VolumeRecord{Name: name, Size: fs.MaxFileSize, Stripes: &s, Filesystem: true}, nil)
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

// tendEvery is how often a host of replicated volumes looks at the
// cluster: for nodes down, and for extents to repair.
const tendEvery = time.Second

// tender keeps a host's replicated volumes whole: it drops every node the
// control plane reports down (its lease expired: SIGKILL, power-off, a
// partition from etcd), so that nothing is read from it again (it may
// come back with stale bytes, or empty with its volume ids re-used), and
// copies each degraded extent to a node up that does not hold it, one
// extent at a time, at most RepairRate bytes a second. A host that
// crashes mid-copy leaves a node joining the extent; the next holder
// drops it and starts that extent over.
type tender struct {
	cli    *clientv3.Client
	cfg    Config
	r      *replica.Remote
	vols   []pageid.VolumeInfo
	groups []fsGroup
	dial   func(ctx context.Context, addr string) (*memnode.Client, error)

	mu      sync.Mutex
	clients map[string]*memnode.Client // repair targets dialled, by node id
}

func (t *tender) run(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(tendEvery)
		defer tick.Stop()
		dropped := map[string]bool{}
		t.dropJoining(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			nodes, err := cluster.Nodes(ctx, t.cli, t.cfg.Cluster)
			if err != nil {
				continue // etcd unreachable: the session's doubt handles it
			}
			for _, n := range nodes {
				if n.Up {
					delete(dropped, n.ID) // back: it holds nothing until a repair copies to it
					continue
				}
				if dropped[n.ID] {
					continue
				}
				if err := t.r.DropNode(ctx, n.ID); err != nil {
					t.cfg.Log.Error("host: memory node down; some extents had no other replica", "node", n.ID, "err", err)
				} else {
					t.cfg.Log.Warn("host: memory node down; its replicas are dropped", "node", n.ID, "addr", n.Addr)
				}
				dropped[n.ID] = true
			}
			t.refresh(ctx)
			t.repair(ctx, nodes)
			t.move(ctx, nodes)
		}
	}()
	return func() {
		cancel()
		<-done
		// The host wrote its dirty pages back before its closers run: the
		// Remote sends nothing more to these.
		for _, c := range t.clients {
			c.Close()
		}
	}
}

// fsGroup is a filesystem's volumes, and what of each a copy must carry.
type fsGroup struct {
	g       *replica.Group
	written func(vol uint16, each func(off, n uint64))
}

// dropJoining drops the nodes left joining an extent by a holder that
// stopped mid-copy: their copy is partial, and the repair starts over.
func (t *tender) dropJoining(ctx context.Context) {
	for _, fg := range t.groups {
		s := fg.g.Stripes()
		for e, joining := range s.Joining {
			for _, id := range joining {
				if ns, err := cluster.DropReplica(ctx, t.cli, t.cfg.Cluster, fg.g.Record(), e, id); err != nil {
					t.cfg.Log.Warn("host: dropping a repair left half-done", "fs", fg.g.Record(), "node", id, "err", err)
				} else {
					fg.g.Install(ns)
				}
			}
		}
	}
	for _, v := range t.vols {
		s, _ := t.r.Stripes(v.ID)
		for e, joining := range s.Joining {
			for _, id := range joining {
				if _, err := cluster.DropReplica(ctx, t.cli, t.cfg.Cluster, v.Name, e, id); err != nil {
					t.cfg.Log.Warn("host: dropping a repair left half-done", "volume", v.Name, "extent", e, "node", id, "err", err)
				}
			}
		}
	}
}

// refresh installs the stripe maps of the control plane where they are
// newer: an operator's moves.
func (t *tender) refresh(ctx context.Context) {
	for _, fg := range t.groups {
		if rec, err := cluster.GetVolume(ctx, t.cli, t.cfg.Cluster, fg.g.Record()); err == nil && rec.Stripes != nil {
			fg.g.Install(*rec.Stripes)
		}
	}
	for _, v := range t.vols {
		if rec, err := cluster.GetVolume(ctx, t.cli, t.cfg.Cluster, v.Name); err == nil && rec.Stripes != nil {
			t.r.Install(v.ID, *rec.Stripes)
		}
	}
}

// target chooses a node to copy extent e of a volume with map s to: up,
// not draining, not failing lately, not holding it; prefer is taken if
// it is one of those.
func (t *tender) target(ctx context.Context, nodes []cluster.Node, s cluster.Stripes, e int, prefer string) (cluster.Node, *memnode.Client, error) {
	return t.targetFor(ctx, nodes, s.Writers(e), s.ExtentBytes, prefer)
}

// targetFor chooses a node to copy need bytes to, up, not draining, not
// failing lately and not one of has; prefer is taken if it is fit.
func (t *tender) targetFor(ctx context.Context, nodes []cluster.Node, has []string, need uint64, prefer string) (cluster.Node, *memnode.Client, error) {
	var fit []cluster.Node
	for _, n := range nodes {
		if n.Up && !n.Draining && !slices.Contains(has, n.ID) && !t.r.Suspect(n.ID) {
			if n.ID == prefer {
				fit = []cluster.Node{n}
				break
			}
			fit = append(fit, n)
		}
	}
	target, err := cluster.Place(fit, need, rand.IntN)
	if err != nil {
		return target, nil, err
	}
	c, err := t.client(ctx, target)
	if err != nil {
		return target, nil, fmt.Errorf("node %s unreachable: %w", target.ID, err)
	}
	return target, c, nil
}

// pacer spaces a copy to RepairRate bytes a second.
func (t *tender) pacer() func(int) {
	start := time.Now()
	var done int64
	return func(n int) {
		done += int64(n)
		if rate := t.cfg.RepairRate; rate > 0 {
			if ahead := time.Duration(float64(done)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
	}
}

// move carries out the moves operators asked for, one extent at a time,
// until one fails (the next round tries again).
func (t *tender) move(ctx context.Context, nodes []cluster.Node) {
	for _, fg := range t.groups {
		for _, m := range fg.g.Stripes().Moves {
			if ctx.Err() != nil {
				return
			}
			s := fg.g.Stripes()
			if slices.Contains(s.Extents[0], m.From) {
				to, c := m.To, (*memnode.Client)(nil)
				if !slices.Contains(s.Extents[0], m.To) {
					target, tc, err := t.targetFor(ctx, nodes, s.Writers(0), 0, m.To)
					if err != nil {
						t.cfg.Log.Warn("host: no node to move a filesystem to", "fs", fg.g.Record(), "from", m.From, "err", err)
						break
					}
					to, c = target.ID, tc
				}
				start := time.Now()
				if err := fg.g.Move(ctx, m.From, to, c, t.pacer(), fg.written); err != nil {
					t.cfg.Log.Warn("host: moving a filesystem failed; retrying", "fs", fg.g.Record(), "from", m.From, "to", to, "err", err)
					break
				}
				t.cfg.Log.Info(fmt.Sprintf("filesystem %s moved from node %s to %s in %v", fg.g.Record(), m.From, to, time.Since(start).Round(time.Millisecond)))
			}
			if ns, err := cluster.DoneMove(ctx, t.cli, t.cfg.Cluster, fg.g.Record(), m); err == nil {
				fg.g.Install(ns)
			}
		}
	}
	for _, v := range t.vols {
		s, _ := t.r.Stripes(v.ID)
		for _, m := range s.Moves {
			if ctx.Err() != nil {
				return
			}
			s, _ := t.r.Stripes(v.ID)
			if slices.Contains(s.Extents[m.Extent], m.From) {
				// A target that is a replica already needs no copy, nor a client.
				to, c := m.To, (*memnode.Client)(nil)
				if !slices.Contains(s.Extents[m.Extent], m.To) {
					target, tc, err := t.target(ctx, nodes, s, m.Extent, m.To)
					if err != nil {
						t.cfg.Log.Warn("host: no node to move an extent to", "volume", v.Name, "extent", m.Extent, "from", m.From, "err", err)
						return
					}
					to, c = target.ID, tc
				}
				start := time.Now()
				if err := t.r.Move(ctx, v.ID, m.Extent, m.From, to, c, t.pacer()); err != nil {
					t.cfg.Log.Warn("host: moving an extent failed; retrying", "volume", v.Name, "extent", m.Extent, "from", m.From, "to", to, "err", err)
					return
				}
				t.cfg.Log.Info(fmt.Sprintf("volume %s extent %d moved from node %s to %s in %v", v.Name, m.Extent, m.From, to, time.Since(start).Round(time.Millisecond)))
			}
			if ns, err := cluster.DoneMove(ctx, t.cli, t.cfg.Cluster, v.Name, m); err == nil {
				t.r.Install(v.ID, ns)
			}
		}
	}
}

// repair copies degraded extents until none is left or one fails (the
// next round tries again), within ctx.
func (t *tender) repair(ctx context.Context, nodes []cluster.Node) {
	for _, fg := range t.groups {
		if ctx.Err() != nil || !fg.g.Degraded() {
			continue
		}
		s := fg.g.Stripes()
		target, c, err := t.targetFor(ctx, nodes, s.Writers(0), 0, "")
		if errors.Is(err, cluster.ErrNoNode) {
			continue
		}
		if err != nil {
			t.cfg.Log.Warn("host: repair target unreachable", "node", target.ID, "err", err)
			continue
		}
		start := time.Now()
		if err := fg.g.Repair(ctx, target.ID, c, t.pacer(), fg.written); err != nil {
			t.cfg.Log.Warn("host: repair of a filesystem failed; retrying", "fs", fg.g.Record(), "node", target.ID, "err", err)
			continue
		}
		t.cfg.Log.Info(fmt.Sprintf("filesystem %s copied to node %s in %v", fg.g.Record(), target.ID, time.Since(start).Round(time.Millisecond)))
	}
	for _, v := range t.vols {
		for _, e := range t.r.Degraded(v.ID) {
			if ctx.Err() != nil {
				return
			}
			s, _ := t.r.Stripes(v.ID)
			target, c, err := t.target(ctx, nodes, s, e, "")
			if errors.Is(err, cluster.ErrNoNode) {
				return // no node to copy to: the extent stays degraded
			}
			if err != nil {
				t.cfg.Log.Warn("host: repair target unreachable", "node", target.ID, "err", err)
				return
			}
			start := time.Now()
			if err := t.r.Repair(ctx, v.ID, e, target.ID, c, t.pacer()); err != nil {
				t.cfg.Log.Warn("host: repair failed; retrying", "volume", v.Name, "extent", e, "node", target.ID, "err", err)
				return
			}
			s, _ = t.r.Stripes(v.ID)
			deg, _ := s.Degraded()
			t.cfg.Log.Info(fmt.Sprintf("volume %s extent %d copied to node %s in %v; %d extents degraded",
				v.Name, e, target.ID, time.Since(start).Round(time.Millisecond), deg))
		}
	}
}

// client is a connection to node n for repairs, kept once made.
func (t *tender) client(ctx context.Context, n cluster.Node) (*memnode.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.clients[n.ID]; ok {
		return c, nil
	}
	c, err := t.dial(ctx, n.Addr)
	if err != nil {
		return nil, err
	}
	if t.clients == nil {
		t.clients = make(map[string]*memnode.Client)
	}
	t.clients[n.ID] = c
	return c, nil
}

// replicatedVolume returns the record of volume vs, placing it over the
// nodes up and creating its copies at them if the control plane has no
// record of it.
func replicatedVolume(ctx context.Context, cli *clientv3.Client, cfg Config, nodes []cluster.Node, vs VolumeSpec, dial func(string) *memnode.Client) (cluster.VolumeRecord, error) {
	rec, err := cluster.GetVolume(ctx, cli, cfg.Cluster, vs.Name)
	switch {
	case err == nil && rec.Filesystem:
		return rec, errors.New("it is a filesystem's placement, not a volume")
	case err == nil && rec.Stripes == nil:
		return rec, fmt.Errorf("it lives on one memory node (%s), not replicated: serve it without --replicas", rec.NodeAddr)
	case err == nil && rec.State != cluster.VolumeReady:
		return rec, fmt.Errorf("it is %s (pd3 volume): not serving it", rec.State)
	case err == nil:
		return rec, nil
	case !errors.Is(err, cluster.ErrNoVolume):
		return rec, err
	}
	rec, err = CreateReplicated(ctx, cli, cfg.Cluster, nodes, vs.Name, vs.Size, cfg.Replicas, dial)
	if errors.Is(err, cluster.ErrVolumeExists) {
		return replicatedVolume(ctx, cli, cfg, nodes, vs, dial) // another host placed it first
	}
	if err == nil {
		s := rec.Stripes
		cfg.Log.Info(fmt.Sprintf("volume %s placed: %s of %d MiB over %s, %s each", vs.Name, plural(len(s.Extents), "extent"),
			s.ExtentBytes>>20, plural(len(s.Nodes()), "node"), plural(s.Replicas, "replica")))
	}
	return rec, err
}

// CreateReplicated places a replicated volume of size bytes over the
// nodes up (replicas copies of each extent, fewer if fewer nodes are up),
// records it in the control plane, and creates its copy at every node of
// its map (dial returns a node's client by id, or nil if it cannot reach
// it). A volume of that name is cluster.ErrVolumeExists; on any failure
// the record and the copies made are removed.
func CreateReplicated(ctx context.Context, cli *clientv3.Client, clusterName string, nodes []cluster.Node, name string, size uint64, replicas int, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	stripes, err := cluster.PlaceStripes(nodes, size, cluster.DefaultExtentBytes, replicas, rand.IntN)
	if err != nil {
		return cluster.VolumeRecord{}, err
	}
	return reserveReplicated(ctx, cli, clusterName, cluster.VolumeRecord{Name: name, Size: size, Stripes: &stripes}, dial)
}

// reserveReplicated records replicated volume rec (name, size, stripes;
// the id is handed out here) and, unless dial is nil, creates its copy at
// every node of the map; on a failure the record and the copies made are
// removed.
func reserveReplicated(ctx context.Context, cli *clientv3.Client, clusterName string, rec cluster.VolumeRecord, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
	name, size := rec.Name, rec.Size
	// A copy at every node of the map, sparse: a node stores only the
	// extents placed on it.
	var copies []string
	if dial != nil {
		copies = rec.Stripes.Nodes()
	}
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
		} else if _, err = c.Create(ctx, name, size); err != nil {
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

// ResizeReplicated grows the replicated volume of rec (marked resizing,
// so no host serves it) to size bytes: the extents added are placed as at
// creation, every node of the longer map that is up gets its copy grown
// (or made) to the new size, and the record goes back to ready with the
// new map and size. A node of the map that is down keeps its smaller
// copy: it holds none of the new extents, and a repair onto it grows its
// copy first. Cut short, the record stays resizing with the old map, and
// running it again finishes it (copies already grown stay so).
func ResizeReplicated(ctx context.Context, cli *clientv3.Client, clusterName string, nodes []cluster.Node, rec cluster.VolumeRecord, size uint64, dial func(id string) *memnode.Client) (cluster.VolumeRecord, error) {
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

// etcdControl changes stripe maps in the control plane.
type etcdControl struct {
	cli     *clientv3.Client
	cluster string
}

func (d etcdControl) DropReplica(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.DropReplica(ctx, d.cli, d.cluster, vol, extent, node)
}

func (d etcdControl) AddJoining(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.AddJoining(ctx, d.cli, d.cluster, vol, extent, node)
}

func (d etcdControl) Promote(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.Promote(ctx, d.cli, d.cluster, vol, extent, node)
}

// plural is "1 node", "3 nodes".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

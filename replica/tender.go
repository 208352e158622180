package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// tendEvery is how often a host of replicated volumes looks at the
// cluster: for nodes down, and for extents to repair.
const tendEvery = time.Second

// A Tender keeps a host's replicated volumes whole: it drops every node the
// control plane reports down (its lease expired: SIGKILL, power-off, a
// partition from etcd), so that nothing is read from it again (it may
// come back with stale bytes, or empty with its volume ids re-used), and
// copies each degraded extent to a node up that does not hold it, one
// extent at a time, at most RepairRate bytes a second. A host that
// crashes mid-copy leaves a node joining the extent; the next holder
// drops it and starts that extent over.
type Tender struct {
	Etcd    *clientv3.Client
	Cluster string // the cluster's name in etcd
	Remote  *Remote
	Volumes []pageid.VolumeInfo // the volumes of Remote to tend
	Groups  []TendedGroup       // filesystems' groups to tend
	// Dial connects to a repair target at addr; the Tender closes what it
	// dialled when it stops.
	Dial func(ctx context.Context, addr string) (*memnode.Client, error)
	// RepairRate bounds the bytes a second a copy makes (0: no bound).
	RepairRate int64
	Log        *slog.Logger

	mu      sync.Mutex
	clients map[string]*memnode.Client // repair targets dialled, by node id
}

// Run tends the volumes every second until stop is called; stop returns
// once the tender has stopped and closed the clients it dialled.
func (t *Tender) Run(ctx context.Context) (stop func()) {
	if t.Log == nil {
		t.Log = slog.Default()
	}
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
			nodes, err := cluster.Nodes(ctx, t.Etcd, t.Cluster)
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
				if err := t.Remote.DropNode(ctx, n.ID); err != nil {
					t.Log.Error("replica: memory node down; some extents had no other replica", "node", n.ID, "err", err)
				} else {
					t.Log.Warn("replica: memory node down; its replicas are dropped", "node", n.ID, "addr", n.Addr)
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

// TendedGroup is a filesystem's volumes, and what of each a copy must
// carry: Written calls each for every range of vol that holds data.
type TendedGroup struct {
	Group   *Group
	Written func(vol uint16, each func(off, n uint64))
}

// dropJoining drops the nodes left joining an extent by a holder that
// stopped mid-copy: their copy is partial, and the repair starts over.
func (t *Tender) dropJoining(ctx context.Context) {
	for _, fg := range t.Groups {
		s := fg.Group.Stripes()
		for e, joining := range s.Joining {
			for _, id := range joining {
				if ns, err := cluster.DropReplica(ctx, t.Etcd, t.Cluster, fg.Group.Record(), e, id); err != nil {
					t.Log.Warn("replica: dropping a repair left half-done", "fs", fg.Group.Record(), "node", id, "err", err)
				} else {
					fg.Group.Install(ns)
				}
			}
		}
	}
	for _, v := range t.Volumes {
		s, _ := t.Remote.Stripes(v.ID)
		for e, joining := range s.Joining {
			for _, id := range joining {
				if _, err := cluster.DropReplica(ctx, t.Etcd, t.Cluster, v.Name, e, id); err != nil {
					t.Log.Warn("replica: dropping a repair left half-done", "volume", v.Name, "extent", e, "node", id, "err", err)
				}
			}
		}
	}
}

// refresh installs the stripe maps of the control plane where they are
// newer: an operator's moves. The records are read in one request, not
// one per volume: an idle host of a thousand volumes asked etcd a
// thousand times a second.
func (t *Tender) refresh(ctx context.Context) {
	if len(t.Groups)+len(t.Volumes) == 0 {
		return
	}
	recs, err := cluster.Volumes(ctx, t.Etcd, t.Cluster)
	if err != nil {
		return // etcd unreachable: the next tick asks again
	}
	byName := make(map[string]*cluster.VolumeRecord, len(recs))
	for i := range recs {
		byName[recs[i].Name] = &recs[i]
	}
	for _, fg := range t.Groups {
		if rec := byName[fg.Group.Record()]; rec != nil && rec.Stripes != nil {
			fg.Group.Install(*rec.Stripes)
		}
	}
	for _, v := range t.Volumes {
		if rec := byName[v.Name]; rec != nil && rec.Stripes != nil {
			t.Remote.Install(v.ID, *rec.Stripes)
		}
	}
}

// target chooses a node to copy extent e of a volume with map s to: up,
// not draining, not failing lately, not holding it; prefer is taken if
// it is one of those.
func (t *Tender) target(ctx context.Context, nodes []cluster.Node, s cluster.Stripes, e int, prefer string) (cluster.Node, *memnode.Client, error) {
	return t.targetFor(ctx, nodes, s.Writers(e), s.ExtentBytes, prefer)
}

// targetFor chooses a node to copy need bytes to, up, not draining, not
// failing lately and not one of has; prefer is taken if it is fit.
func (t *Tender) targetFor(ctx context.Context, nodes []cluster.Node, has []string, need uint64, prefer string) (cluster.Node, *memnode.Client, error) {
	var fit []cluster.Node
	for _, n := range nodes {
		if n.Up && !n.Draining && !slices.Contains(has, n.ID) && !t.Remote.Suspect(n.ID) {
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
func (t *Tender) pacer() func(int) { return Pacer(t.RepairRate) }

// Pacer spaces a copy to rate bytes a second (0: no bound): call the
// function it returns with each piece's bytes as it is copied.
func Pacer(rate int64) func(int) {
	start := time.Now()
	var done int64
	return func(n int) {
		done += int64(n)
		if rate > 0 {
			if ahead := time.Duration(float64(done)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
	}
}

// move carries out the moves operators asked for, one extent at a time,
// until one fails (the next round tries again).
func (t *Tender) move(ctx context.Context, nodes []cluster.Node) {
	for _, fg := range t.Groups {
		for _, m := range fg.Group.Stripes().Moves {
			if ctx.Err() != nil {
				return
			}
			s := fg.Group.Stripes()
			if slices.Contains(s.Extents[0], m.From) {
				to, c := m.To, (*memnode.Client)(nil)
				if !slices.Contains(s.Extents[0], m.To) {
					target, tc, err := t.targetFor(ctx, nodes, s.Writers(0), 0, m.To)
					if err != nil {
						t.Log.Warn("replica: no node to move a filesystem to", "fs", fg.Group.Record(), "from", m.From, "err", err)
						break
					}
					to, c = target.ID, tc
				}
				start := time.Now()
				if err := fg.Group.Move(ctx, m.From, to, c, t.pacer(), fg.Written); err != nil {
					t.Log.Warn("replica: moving a filesystem failed; retrying", "fs", fg.Group.Record(), "from", m.From, "to", to, "err", err)
					break
				}
				t.Log.Info(fmt.Sprintf("filesystem %s moved from node %s to %s in %v", fg.Group.Record(), m.From, to, time.Since(start).Round(time.Millisecond)))
			}
			if ns, err := cluster.DoneMove(ctx, t.Etcd, t.Cluster, fg.Group.Record(), m); err == nil {
				fg.Group.Install(ns)
			}
		}
	}
	for _, v := range t.Volumes {
		s, _ := t.Remote.Stripes(v.ID)
		for _, m := range s.Moves {
			if ctx.Err() != nil {
				return
			}
			s, _ := t.Remote.Stripes(v.ID)
			if slices.Contains(s.Extents[m.Extent], m.From) {
				// A target that is a replica already needs no copy, nor a client.
				to, c := m.To, (*memnode.Client)(nil)
				if !slices.Contains(s.Extents[m.Extent], m.To) {
					target, tc, err := t.target(ctx, nodes, s, m.Extent, m.To)
					if err != nil {
						t.Log.Warn("replica: no node to move an extent to", "volume", v.Name, "extent", m.Extent, "from", m.From, "err", err)
						return
					}
					to, c = target.ID, tc
				}
				start := time.Now()
				if err := t.Remote.Move(ctx, v.ID, m.Extent, m.From, to, c, t.pacer()); err != nil {
					t.Log.Warn("replica: moving an extent failed; retrying", "volume", v.Name, "extent", m.Extent, "from", m.From, "to", to, "err", err)
					return
				}
				t.Log.Info(fmt.Sprintf("volume %s extent %d moved from node %s to %s in %v", v.Name, m.Extent, m.From, to, time.Since(start).Round(time.Millisecond)))
			}
			if ns, err := cluster.DoneMove(ctx, t.Etcd, t.Cluster, v.Name, m); err == nil {
				t.Remote.Install(v.ID, ns)
			}
		}
	}
}

// repair copies degraded extents until none is left or one fails (the
// next round tries again), within ctx.
func (t *Tender) repair(ctx context.Context, nodes []cluster.Node) {
	for _, fg := range t.Groups {
		if ctx.Err() != nil || !fg.Group.Degraded() {
			continue
		}
		s := fg.Group.Stripes()
		target, c, err := t.targetFor(ctx, nodes, s.Writers(0), 0, "")
		if errors.Is(err, cluster.ErrNoNode) {
			continue
		}
		if err != nil {
			t.Log.Warn("replica: repair target unreachable", "node", target.ID, "err", err)
			continue
		}
		start := time.Now()
		if err := fg.Group.Repair(ctx, target.ID, c, t.pacer(), fg.Written); err != nil {
			t.Log.Warn("replica: repair of a filesystem failed; retrying", "fs", fg.Group.Record(), "node", target.ID, "err", err)
			continue
		}
		t.Log.Info(fmt.Sprintf("filesystem %s copied to node %s in %v", fg.Group.Record(), target.ID, time.Since(start).Round(time.Millisecond)))
	}
	for _, v := range t.Volumes {
		for _, e := range t.Remote.Degraded(v.ID) {
			if ctx.Err() != nil {
				return
			}
			s, _ := t.Remote.Stripes(v.ID)
			target, c, err := t.target(ctx, nodes, s, e, "")
			if errors.Is(err, cluster.ErrNoNode) {
				return // no node to copy to: the extent stays degraded
			}
			if err != nil {
				t.Log.Warn("replica: repair target unreachable", "node", target.ID, "err", err)
				return
			}
			start := time.Now()
			if err := t.Remote.Repair(ctx, v.ID, e, target.ID, c, t.pacer()); err != nil {
				t.Log.Warn("replica: repair failed; retrying", "volume", v.Name, "extent", e, "node", target.ID, "err", err)
				return
			}
			s, _ = t.Remote.Stripes(v.ID)
			deg, _ := s.Degraded()
			t.Log.Info(fmt.Sprintf("volume %s extent %d copied to node %s in %v; %d extents degraded",
				v.Name, e, target.ID, time.Since(start).Round(time.Millisecond), deg))
		}
	}
}

// client is a connection to node n for repairs, kept once made.
func (t *Tender) client(ctx context.Context, n cluster.Node) (*memnode.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.clients[n.ID]; ok {
		return c, nil
	}
	c, err := t.Dial(ctx, n.Addr)
	if err != nil {
		return nil, err
	}
	if t.clients == nil {
		t.clients = make(map[string]*memnode.Client)
	}
	t.clients[n.ID] = c
	return c, nil
}

// EtcdControl is the Control of a cluster whose control plane is etcd.
type EtcdControl struct {
	Client  *clientv3.Client
	Cluster string // the cluster's name
}

func (d EtcdControl) DropReplica(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.DropReplica(ctx, d.Client, d.Cluster, vol, extent, node)
}

func (d EtcdControl) AddJoining(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.AddJoining(ctx, d.Client, d.Cluster, vol, extent, node)
}

func (d EtcdControl) Promote(ctx context.Context, vol string, extent int, node string) (cluster.Stripes, error) {
	return cluster.Promote(ctx, d.Client, d.Cluster, vol, extent, node)
}

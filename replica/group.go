package replica

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// Group is a set of volumes that live together: each of them at every
// node of one map with one extent, kept in the control plane under one
// record. A filesystem's files are a group (it is an fs.Backend): a file
// is made and freed at the nodes without a change in the control plane,
// and a failure, repair or move changes the one record for all of them.
// The volumes are the ones whose names start with the group's prefix at
// the nodes; their ids are this host's, handed out by the Remote.
type Group struct {
	r      *Remote
	p      *placement
	prefix string

	// mu orders creates and deletes (shared) against a repair making
	// every volume at the node it copies to and having it join
	// (exclusive): a create either comes first, and the repair makes the
	// volume there, or sees the node joining and makes it there itself.
	mu     sync.RWMutex
	nameMu sync.Mutex
	names  map[string]*volume
}

// OpenGroup serves the group of volumes named prefix+* that live at the
// nodes of map s, kept in the control plane as record (s has one extent,
// covering every offset its volumes use). A volume missing at a replica
// is treated as that replica having failed: its first write drops the
// node from the group.
func (r *Remote) OpenGroup(ctx context.Context, record, prefix string, s cluster.Stripes) (*Group, error) {
	if len(s.Extents) != 1 {
		return nil, fmt.Errorf("replica: group %q: %d extents, want 1", record, len(s.Extents))
	}
	if err := checkStripes(record, s); err != nil {
		return nil, err
	}
	g := &Group{r: r, p: newPlacement(record, s), prefix: prefix, names: make(map[string]*volume)}
	found := map[string]*volume{}
	nodes := *r.nodes.Load()
	for _, id := range s.Extents[0] {
		n, ok := nodes[id]
		if !ok {
			continue
		}
		infos, err := n.c.List(ctx)
		if err != nil {
			if !replicaFault(ctx, err) {
				return nil, fmt.Errorf("replica: group %q: listing node %s: %w", record, id, err)
			}
			continue // the first write drops it
		}
		for _, info := range infos {
			if !strings.HasPrefix(info.Name, prefix) {
				continue
			}
			v := found[info.Name]
			if v == nil {
				v = g.newVolume(info.Name, info.Size, map[string]uint16{})
				found[info.Name] = v
			}
			(*v.local.Load())[id] = info.ID
		}
	}
	for name, v := range found {
		if _, err := r.add(v); err != nil {
			g.close()
			return nil, err
		}
		g.names[name] = v
	}
	return g, nil
}

func (g *Group) newVolume(name string, size uint64, local map[string]uint16) *volume {
	v := &volume{Name: name, Size: size, p: g.p, locks: make([]sync.RWMutex, 1)}
	v.local.Store(&local)
	return v
}

// close stops serving the group's volumes.
func (g *Group) close() {
	g.nameMu.Lock()
	defer g.nameMu.Unlock()
	for _, v := range g.names {
		g.r.remove(v)
	}
	clear(g.names)
}

// Record is the control plane's name of the group's map.
func (g *Group) Record() string { return g.p.record }

// Stripes is the group's map.
func (g *Group) Stripes() cluster.Stripes { return *g.p.stripes.Load() }

// Install makes s the group's map if it is newer (a change read from the
// control plane).
func (g *Group) Install(s cluster.Stripes) {
	if len(s.Extents) == 1 {
		g.p.install(s)
	}
}

// Degraded reports whether the group has fewer replicas than wanted and
// no node joining.
func (g *Group) Degraded() bool {
	s := g.p.stripes.Load()
	return len(s.Extents[0]) < s.Replicas && len(s.Writers(0)) == len(s.Extents[0])
}

func (g *Group) lookup(name string) *volume {
	g.nameMu.Lock()
	defer g.nameMu.Unlock()
	return g.names[name]
}

func (g *Group) members() []*volume {
	g.nameMu.Lock()
	defer g.nameMu.Unlock()
	return slices.Collect(maps.Values(g.names))
}

func (g *Group) info(v *volume) pageid.VolumeInfo {
	return pageid.VolumeInfo{ID: v.ID, Name: v.Name, Size: v.Size}
}

// Create makes volume name (it must start with the group's prefix) at
// every node of the group. A node that cannot be reached is dropped
// from the group, as for a write it missed; a refusal (the name exists,
// no memory) undoes the copies made and is returned as the node said it.
func (g *Group) Create(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	if !strings.HasPrefix(name, g.prefix) {
		return pageid.VolumeInfo{}, fmt.Errorf("replica: volume %q is not of group %q", name, g.prefix)
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.lookup(name) != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("replica: volume %q: %w", name, pageid.ErrExists)
	}
	writers := g.p.stripes.Load().Writers(0)
	nodes := *g.r.nodes.Load()
	ids := make([]uint16, len(writers))
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, id := range writers {
		n, ok := nodes[id]
		if !ok {
			errs[i] = fmt.Errorf("node %s: %w", id, pageid.ErrUnavailable)
			continue
		}
		wg.Go(func() {
			info, err := n.c.Create(ctx, name, size)
			ids[i], errs[i] = info.ID, err
		})
	}
	wg.Wait()
	local := map[string]uint16{}
	var refused error
	var failed []string
	for i, id := range writers {
		switch err := errs[i]; {
		case err == nil:
			local[id] = ids[i]
		case replicaFault(ctx, err) && !errors.Is(err, pageid.ErrExists) &&
			!errors.Is(err, pageid.ErrNoMemory) && !errors.Is(err, pageid.ErrNoSpace):
			failed = append(failed, id)
		default:
			refused = errors.Join(refused, fmt.Errorf("node %s: %w", id, err))
		}
	}
	if refused == nil && !slices.ContainsFunc(g.p.stripes.Load().Extents[0], func(id string) bool { _, ok := local[id]; return ok }) {
		refused = fmt.Errorf("replica: volume %q: no replica made it: %w", name, ErrLost)
	}
	if refused == nil {
		for _, id := range failed {
			if err := g.r.drop(ctx, g.p, 0, id); err != nil {
				refused = fmt.Errorf("replica: node %s failed to make volume %q and could not be dropped: %w", id, name, err)
			}
		}
	}
	if refused != nil {
		for id := range local {
			nodes[id].c.Delete(context.WithoutCancel(ctx), name)
		}
		return pageid.VolumeInfo{}, refused
	}
	v := g.newVolume(name, size, local)
	if _, err := g.r.add(v); err != nil {
		return pageid.VolumeInfo{}, err
	}
	g.nameMu.Lock()
	g.names[name] = v
	g.nameMu.Unlock()
	return g.info(v), nil
}

// OpenOrCreate is the group's volume name, made if it is not there.
func (g *Group) OpenOrCreate(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	if v := g.lookup(name); v != nil {
		return g.info(v), nil
	}
	return g.Create(ctx, name, size)
}

// Delete frees volume name at every node holding it.
func (g *Group) Delete(ctx context.Context, name string) error {
	return g.delete(ctx, name, func(c *memnode.Client) error { return c.Delete(ctx, name) })
}

// DeleteFenced is Delete with a fencing token (memnode.Client.DeleteFenced).
func (g *Group) DeleteFenced(ctx context.Context, name string, token uint64) error {
	return g.delete(ctx, name, func(c *memnode.Client) error { return c.DeleteFenced(ctx, name, token) })
}

// delete stops serving the volume, then frees it at its nodes under its
// extent's lock (a repair copying it sees it either whole or gone); a
// name not served is freed at every node of the group that has it. A
// node that cannot be reached keeps its copy: the group's next open
// finds it, and the filesystem deletes it as an orphan.
func (g *Group) delete(ctx context.Context, name string, del func(*memnode.Client) error) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	g.nameMu.Lock()
	v := g.names[name]
	delete(g.names, name)
	g.nameMu.Unlock()
	at := g.p.stripes.Load().Writers(0) // not served: wherever it may be (a create undone half-way)
	if v != nil {
		g.r.remove(v)
		v.locks[0].Lock()
		defer v.locks[0].Unlock()
		at = slices.Collect(maps.Keys(*v.local.Load()))
	}
	nodes := *g.r.nodes.Load()
	var errs error
	missing := 0
	for _, id := range at {
		n, ok := nodes[id]
		if !ok {
			continue
		}
		switch err := del(n.c); {
		case errors.Is(err, pageid.ErrNoVolume):
			missing++
		case err != nil && !replicaFault(ctx, err):
			errs = errors.Join(errs, fmt.Errorf("node %s: %w", id, err))
		}
	}
	if v == nil && missing == len(at) {
		return fmt.Errorf("replica: volume %q: %w", name, pageid.ErrNoVolume)
	}
	return errs
}

// List is the group's volumes, with the memory each holds at one replica.
func (g *Group) List(ctx context.Context) ([]pageid.VolumeInfo, error) {
	stored := map[string]uint64{}
	var buf [maxReplicas]*node
	for _, n := range g.r.replicas(g.p.stripes.Load(), 0, &buf) {
		infos, err := n.c.List(ctx)
		if err != nil {
			continue
		}
		for _, info := range infos {
			stored[info.Name] = info.Stored
		}
		break
	}
	var out []pageid.VolumeInfo
	for _, v := range g.members() {
		info := g.info(v)
		info.Stored = stored[v.Name]
		out = append(out, info)
	}
	return out, nil
}

// ReadAt reads p at byte off of the group's volume vol from a replica.
func (g *Group) ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return g.r.ReadAt(ctx, vol, off, p)
}

// WriteAt writes p at byte off of the group's volume vol at every node.
func (g *Group) WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return g.r.WriteAt(ctx, vol, off, p)
}

// Repair copies the group to node target (reached through c) and makes
// it a replica: first, with creates and deletes held off, every volume
// of the group is made afresh there (what the node held of the group
// before is deleted: it may be stale) and fenced, and the node joins the
// group's map, so every write and create from then on reaches it; then
// the bytes of each volume that written reports (off, n ranges: what its
// owner ever wrote; the volumes are sparse and huge, so it is required)
// are copied chunk by chunk
// under the volume's lock, as Remote.Repair copies an extent; then the
// node is promoted. A failure drops it again.
func (g *Group) Repair(ctx context.Context, target string, c *memnode.Client, pace func(int), written func(vol uint16, each func(off, n uint64))) (err error) {
	r := g.r
	if r.ctl == nil || written == nil {
		return errors.New("replica: a group's repair needs the control plane and the ranges written")
	}
	if slices.Contains(g.p.stripes.Load().Writers(0), target) {
		return fmt.Errorf("replica: group %q: node %s has it", g.p.record, target)
	}
	// The tokens go on the connection the host's writes take.
	c = r.AddNode(target, c)
	if err := g.prepare(ctx, target, c); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.drop(context.WithoutCancel(ctx), g.p, 0, target))
		}
	}()
	buf := make([]byte, memnode.ChunkSize)
	for _, v := range g.members() {
		local, _ := v.localID(target)
		copyRange := func(off, n uint64) {
			end := min(off+n, v.Size)
			for ; err == nil && off < end; off += memnode.ChunkSize {
				err = r.copyChunk(ctx, v, 0, c, local, off, buf[:min(memnode.ChunkSize, end-off)], pace)
			}
		}
		written(v.ID, copyRange)
		if err != nil {
			return fmt.Errorf("replica: copying volume %q to node %s: %w", v.Name, target, err)
		}
	}
	if err = r.change(g.p, func(rec string) (cluster.Stripes, error) { return r.ctl.Promote(ctx, rec, 0, target) }); err != nil {
		return fmt.Errorf("replica: group %q: %w", g.p.record, err)
	}
	r.Repaired.Add(1)
	return nil
}

// prepare makes every volume of the group afresh at target and has the
// node join the group's map, with creates and deletes held off.
func (g *Group) prepare(ctx context.Context, target string, c *memnode.Client) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	infos, err := c.List(ctx)
	if err != nil {
		return fmt.Errorf("replica: group %q: listing node %s: %w", g.p.record, target, err)
	}
	for _, info := range infos {
		if strings.HasPrefix(info.Name, g.prefix) {
			if err := c.Delete(ctx, info.Name); err != nil && !errors.Is(err, pageid.ErrNoVolume) {
				return fmt.Errorf("replica: clearing volume %q at node %s: %w", info.Name, target, err)
			}
		}
	}
	for _, v := range g.members() {
		info, err := c.Create(ctx, v.Name, v.Size)
		if err == nil {
			if tok := v.token.Load(); tok != 0 {
				err = c.Fence(ctx, info.ID, tok)
			}
		}
		if err != nil {
			return fmt.Errorf("replica: making volume %q at node %s: %w", v.Name, target, err)
		}
		v.setLocal(target, info.ID)
	}
	err = g.r.change(g.p, func(rec string) (cluster.Stripes, error) { return g.r.ctl.AddJoining(ctx, rec, 0, target) })
	if err != nil {
		return fmt.Errorf("replica: group %q: %w", g.p.record, err)
	}
	return nil
}

// Move moves the group from node from to node to (reached through c): a
// repair onto to, unless it is a replica already, then from dropped and
// the group's volumes there deleted (best effort: a node that cannot be
// reached is off the map all the same).
func (g *Group) Move(ctx context.Context, from, to string, c *memnode.Client, pace func(int), written func(vol uint16, each func(off, n uint64))) error {
	if !slices.Contains(g.p.stripes.Load().Extents[0], to) {
		if err := g.Repair(ctx, to, c, pace, written); err != nil {
			return err
		}
	}
	if err := g.r.drop(ctx, g.p, 0, from); err != nil {
		return fmt.Errorf("replica: group %q: dropping node %s: %w", g.p.record, from, err)
	}
	n, ok := (*g.r.nodes.Load())[from]
	if !ok {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, v := range g.members() {
		// Writes sent before the drop may still land: the lock waits
		// for them.
		v.locks[0].Lock()
		n.c.DeleteFenced(ctx, v.Name, v.token.Load())
		v.locks[0].Unlock()
	}
	return nil
}

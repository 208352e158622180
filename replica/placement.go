package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/memnode"
)

// Changes of a volume's stripe map: dropping a failed replica, fencing,
// nodes joining, and the repair and moves that rebuild and rebalance
// extents.

// change runs a change of map p through the control plane and installs
// the map it returns, unless a newer one is there already.
func (r *Remote) change(p *placement, fn func(record string) (cluster.Stripes, error)) error {
	if r.ctl == nil {
		return errors.New("no control plane to change the stripe map")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := fn(p.record)
	if err != nil {
		return err
	}
	p.installLocked(s)
	return nil
}

// install makes s the map unless the one in use is as new.
func (p *placement) install(s cluster.Stripes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.installLocked(s)
}

// installLocked is install with mu held.
func (p *placement) installLocked(s cluster.Stripes) {
	if s.Epoch > p.stripes.Load().Epoch {
		s = s.Clone()
		p.stripes.Store(&s)
	}
}

// dropReplica takes node off extent e of v (a replica or a node joining).
func (r *Remote) dropReplica(ctx context.Context, v *volume, e int, node string) error {
	return r.drop(ctx, v.p, e, node)
}

// drop takes node off extent e of map p.
func (r *Remote) drop(ctx context.Context, p *placement, e int, node string) error {
	s := p.stripes.Load()
	if !slices.Contains(s.Writers(e), node) {
		return nil
	}
	err := r.change(p, func(rec string) (cluster.Stripes, error) { return r.ctl.DropReplica(ctx, rec, e, node) })
	if err == nil {
		r.Dropped.Add(1)
	}
	return err
}

// DropNode takes node off every extent that lists it, in every volume:
// the control plane says it is down, and whatever it holds when (if) it
// returns may be stale or gone. An extent whose last replica it is keeps
// it (reads fail until the node is back, never read as zeroes); that is
// reported in the error, after the other extents are dropped.
func (r *Remote) DropNode(ctx context.Context, id string) error {
	var errs error
	for _, v := range r.all() {
		for e := range v.p.stripes.Load().Extents {
			if err := r.dropReplica(ctx, v, e, id); err != nil {
				errs = errors.Join(errs, fmt.Errorf("volume %q extent %d: %w", v.Name, e, err))
			}
		}
	}
	return errs
}

// Fence presents token for volume vol at every node holding one of its
// extents; a node that cannot be reached has its replicas dropped, since
// a superseded writer might still reach it.
func (r *Remote) Fence(ctx context.Context, vol uint16, token uint64) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	v.token.Store(token)
	nodes := *r.nodes.Load()
	for _, id := range v.p.stripes.Load().Nodes() {
		n, reach := nodes[id]
		local, has := v.localID(id)
		if reach && has {
			err = n.c.Fence(ctx, local, token)
			if err == nil || !replicaFault(ctx, err) {
				if err != nil {
					return fmt.Errorf("node %s: %w", id, err)
				}
				continue
			}
		}
		for e := range v.p.stripes.Load().Extents {
			if derr := r.dropReplica(ctx, v, e, id); derr != nil {
				return fmt.Errorf("volume %q: node %s cannot be fenced (%v) nor dropped: %w", v.Name, id, err, derr)
			}
		}
	}
	return nil
}

// Suspect reports whether node id failed a request lately: not a node
// to copy an extent to.
func (r *Remote) Suspect(id string) bool {
	n, ok := (*r.nodes.Load())[id]
	return ok && n.failedAt.Load() > r.now().Add(-suspectFor).UnixNano()
}

// AddNode lets the Remote reach memory node id through c (a node a repair
// copies to). A node it has already is kept. It returns the client the
// Remote writes to the node through: the one a fencing token must be
// presented on (the node fences each connection apart).
func (r *Remote) AddNode(id string, c *memnode.Client) *memnode.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := *r.nodes.Load()
	if n, ok := cur[id]; ok {
		return n.c
	}
	next := maps.Clone(cur)
	next[id] = &node{id: id, c: c}
	r.nodes.Store(&next)
	return c
}

// Degraded lists the extents of volume vol with fewer replicas than
// wanted and no node joining them.
func (r *Remote) Degraded(vol uint16) []int {
	v := r.vols[vol].Load()
	if v == nil {
		return nil
	}
	s := v.p.stripes.Load()
	var out []int
	for e, reps := range s.Extents {
		if len(reps) < s.Replicas && len(s.Writers(e)) == len(reps) {
			out = append(out, e)
		}
	}
	return out
}

// Repair copies extent e of volume vol to memory node target (reached
// through c) and makes it a replica. The node first gets the volume's
// copy, the volume's fencing token, and the extent's range cleared (it may
// hold stale bytes from an earlier life); then it joins the extent, so
// every write from then on reaches it; then each 1 MiB chunk is read from
// a replica and written to it under the extent's lock, which orders the
// copy after the writes already sent (chunks that hold no memory are not
// read, and chunks of zeroes are not written: the cleared range reads as
// zeroes, and a write since then is newer); then
// it is promoted. pace is called with the bytes of each chunk read, to
// throttle. A failure drops the node from the extent again.
func (r *Remote) Repair(ctx context.Context, vol uint16, e int, target string, c *memnode.Client, pace func(int)) (err error) {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	if r.ctl == nil {
		return errors.New("replica: repair needs the control plane")
	}
	s := v.p.stripes.Load()
	if e >= len(s.Extents) || slices.Contains(s.Writers(e), target) {
		return fmt.Errorf("replica: volume %q extent %d: no such extent, or node %s has it", v.Name, e, target)
	}
	// The token goes on the connection the host's writes take.
	c = r.AddNode(target, c)
	info, err := c.OpenOrCreate(ctx, v.Name, v.Size)
	if err != nil {
		return fmt.Errorf("replica: volume %q at node %s: %w", v.Name, target, err)
	}
	if info.Size < v.Size {
		// A copy left from before the volume grew (the node was down).
		if info, err = c.Resize(ctx, v.Name, v.Size); err != nil {
			return fmt.Errorf("replica: growing volume %q at node %s to %d bytes: %w", v.Name, target, v.Size, err)
		}
	}
	if tok := v.token.Load(); tok != 0 {
		if err := c.Fence(ctx, info.ID, tok); err != nil {
			return fmt.Errorf("replica: fencing volume %q at node %s: %w", v.Name, target, err)
		}
	}
	start := uint64(e) * s.ExtentBytes
	end := min(start+s.ExtentBytes, v.Size)
	if err := c.Trim(ctx, info.ID, start, end-start); err != nil {
		return fmt.Errorf("replica: clearing extent %d of volume %q at node %s: %w", e, v.Name, target, err)
	}
	v.setLocal(target, info.ID)
	if err := r.change(v.p, func(rec string) (cluster.Stripes, error) { return r.ctl.AddJoining(ctx, rec, e, target) }); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: %w", v.Name, e, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.dropReplica(context.WithoutCancel(ctx), v, e, target))
		}
	}()
	buf := make([]byte, memnode.ChunkSize)
	for off := start; off < end; off += memnode.ChunkSize {
		if err = r.copyChunk(ctx, v, e, c, info.ID, off, buf[:min(memnode.ChunkSize, end-off)], pace); err != nil {
			return fmt.Errorf("replica: copying extent %d of volume %q to node %s: %w", e, v.Name, target, err)
		}
	}
	if err = r.change(v.p, func(rec string) (cluster.Stripes, error) { return r.ctl.Promote(ctx, rec, e, target) }); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: %w", v.Name, e, err)
	}
	r.Repaired.Add(1)
	return nil
}

// copyChunk copies len(p) bytes at off of extent e of v from a replica
// to local, v's copy at a joining node reached through c, under the
// extent's lock: the copy is ordered after the writes already sent and
// before those not yet sent, which reach the joining node themselves.
// A chunk the replica stores no memory for (MAP) is not read, and one of
// zeroes is not written: the copy was cleared or made afresh. A volume no
// longer served (deleted) is skipped.
func (r *Remote) copyChunk(ctx context.Context, v *volume, e int, c *memnode.Client, local uint16, off uint64, p []byte, pace func(int)) error {
	v.locks[e].Lock()
	defer v.locks[e].Unlock()
	if r.vols[v.ID].Load() != v {
		return nil // deleted: gone at every node
	}
	s := v.p.stripes.Load()
	stored := false
	if err := r.mapExtent(ctx, v, s, off, uint64(len(p)), func(_, _ uint64, hole bool) { stored = stored || !hole }); err != nil {
		return err
	}
	if !stored {
		return nil // reads as zeroes, as the cleared copy does
	}
	if err := r.readExtent(ctx, v, s, off, p); err != nil {
		return err
	}
	if r.copied != nil {
		r.copied(v.ID)
	}
	if !zero(p) {
		if err := c.WriteAt(ctx, local, off, p); err != nil {
			return err
		}
	}
	r.RepairBytes.Add(uint64(len(p)))
	if pace != nil {
		pace(len(p))
	}
	return nil
}

// Install makes s volume vol's map if it is newer than the one in use:
// a change made elsewhere (an operator's moves), read from the control
// plane.
func (r *Remote) Install(vol uint16, s cluster.Stripes) {
	if v := r.vols[vol].Load(); v != nil && len(s.Extents) == len(v.locks) {
		v.p.install(s)
	}
}

// Move moves extent e of volume vol from node from to node to (reached
// through c): a repair onto to (unless it is a replica already), then
// from dropped, its copy of the extent trimmed, and its copy of the
// volume deleted once it holds no extent of it. What from holds is
// cleaned up on a best-effort basis: a node that cannot be reached is
// off the map all the same.
func (r *Remote) Move(ctx context.Context, vol uint16, e int, from, to string, c *memnode.Client, pace func(int)) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	s := v.p.stripes.Load()
	if e >= len(s.Extents) {
		return fmt.Errorf("replica: volume %q has no extent %d", v.Name, e)
	}
	if !slices.Contains(s.Extents[e], to) {
		if err := r.Repair(ctx, vol, e, to, c, pace); err != nil {
			return err
		}
	}
	if err := r.dropReplica(ctx, v, e, from); err != nil {
		return fmt.Errorf("replica: volume %q extent %d: dropping node %s: %w", v.Name, e, from, err)
	}
	n, reach := (*r.nodes.Load())[from]
	local, has := v.localID(from)
	if !reach || !has {
		return nil
	}
	// Writes sent before the drop may still land: take the extent's lock
	// so that they are settled before the range is cleared.
	v.locks[e].Lock()
	start := uint64(e) * s.ExtentBytes
	n.c.Trim(ctx, local, start, min(s.ExtentBytes, v.Size-start))
	v.locks[e].Unlock()
	if !slices.Contains(v.p.stripes.Load().Nodes(), from) {
		n.c.DeleteFenced(ctx, v.Name, v.token.Load())
	}
	return nil
}

func zero(p []byte) bool {
	for len(p) >= 8 {
		if binary.LittleEndian.Uint64(p) != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

package ec

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
)

// nodeByID is node id's client and volume v's id there.
func (r *Remote) nodeByID(v *volume, id string) (Node, uint16, bool) {
	n, ok := (*r.nodes.Load())[id]
	local, has := (*v.local.Load())[id]
	return n, local, ok && has
}

// joiningAt is the shards of group g being rebuilt whose copy has passed
// row o; the row's lock is held.
func (r *Remote) joiningAt(v *volume, g int, o uint64) []join {
	js := v.joining.Load()
	if js == nil {
		return nil
	}
	var out []join
	for _, j := range *js {
		if j.g == g && j.done.Load() > o {
			out = append(out, j)
		}
	}
	return out
}

// AddNode lets the Remote reach memory node id through n, where volume
// vol is local (a node a repair rebuilds a shard on), and presents the
// volume's fencing token there.
func (r *Remote) AddNode(ctx context.Context, id string, n Node, vol uint16, local uint16) error {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	if tok := v.token.Load(); tok != 0 {
		if err := n.Fence(ctx, local, tok); err != nil {
			return fmt.Errorf("ec: volume %q: presenting its fencing token at node %s: %w", v.Name, id, err)
		}
	}
	r.mu.Lock()
	nodes := maps.Clone(*r.nodes.Load())
	nodes[id] = n
	r.nodes.Store(&nodes)
	r.mu.Unlock()
	v.mu.Lock()
	l := maps.Clone(*v.local.Load())
	l[id] = local
	v.local.Store(&l)
	v.mu.Unlock()
	return nil
}

// Lost is the shards of volume vol recorded lost (group and shard), to be
// rebuilt.
func (r *Remote) Lost(vol uint16) [][2]int {
	v, err := r.volume(vol)
	if err != nil {
		return nil
	}
	p := v.p.Load()
	var out [][2]int
	for g, row := range p.Groups {
		for s, id := range row {
			if id == "" && !p.Virtual(g, s) {
				out = append(out, [2]int{g, s})
			}
		}
	}
	return out
}

// DropNode drops every shard at node id (down, as the control plane
// sees it), so that reads go straight to decoding and repair rebuilds
// them elsewhere.
func (r *Remote) DropNode(ctx context.Context, id string) error {
	for _, v := range r.vols {
		p := v.p.Load()
		for g, row := range p.Groups {
			for s, at := range row {
				if at == id {
					if err := r.drop(ctx, v, g, s); err != nil {
						return fmt.Errorf("ec: volume %q: dropping node %s: %w", v.Name, id, err)
					}
				}
			}
		}
	}
	return nil
}

// Repair rebuilds lost shard s of group g of volume vol at node target
// (added with AddNode): each run is decoded from the row's other shards
// and written there under the row's lock, while writes to the rows
// already copied go to target too; then the control plane records
// target as the shard's node. Runs that decode to zeroes are not written
// (the node's volume reads zeroes there). pace is told the bytes of each
// run copied (a rate limit). A repair cut short leaves the shard lost;
// the next starts over.
func (r *Remote) Repair(ctx context.Context, vol uint16, g, s int, target string, pace func(int)) (err error) {
	v, err := r.volume(vol)
	if err != nil {
		return err
	}
	p := v.p.Load()
	if g >= len(p.Groups) || s >= p.Shards() || p.Groups[g][s] != "" || p.Virtual(g, s) {
		return fmt.Errorf("ec: volume %q has no lost shard %d of group %d", v.Name, s, g)
	}
	if slices.Contains(p.Groups[g], target) {
		return fmt.Errorf("ec: volume %q group %d has a shard at node %s already", v.Name, g, target)
	}
	node, local, ok := r.nodeByID(v, target)
	if !ok {
		return fmt.Errorf("ec: node %s is not reachable here (AddNode)", target)
	}
	j := join{g: g, s: s, node: target, done: new(atomic.Uint64)}
	v.mu.Lock()
	var js []join
	if cur := v.joining.Load(); cur != nil {
		js = slices.Clone(*cur)
	}
	js = append(js, j)
	v.joining.Store(&js)
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		cur := slices.DeleteFunc(slices.Clone(*v.joining.Load()), func(o join) bool { return o.done == j.done })
		v.joining.Store(&cur)
		v.mu.Unlock()
	}()
	for o := uint64(0); o < p.ExtentBytes; o += maxRunBytes {
		if err := r.copyRun(ctx, v, g, s, o, node, local, j); err != nil {
			return fmt.Errorf("ec: volume %q: rebuilding shard %d of group %d at node %s: %w", v.Name, s, g, target, err)
		}
		if pace != nil {
			pace(maxRunBytes)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if j.done.Load() < p.ExtentBytes {
		return fmt.Errorf("ec: volume %q: node %s missed a write while shard %d of group %d was rebuilt there; try again", v.Name, target, s, g)
	}
	next, err := r.ctl.SetShard(ctx, v.Name, g, s, target)
	if err != nil {
		return err
	}
	if next.Groups[g][s] != target {
		return fmt.Errorf("ec: the control plane kept shard %d of group %d at %q", s, g, next.Groups[g][s])
	}
	v.p.Store(&next)
	r.Repaired.Add(1)
	return nil
}

// copyRun rebuilds run o of shard s of group g at the repair's node,
// under the row's lock.
func (r *Remote) copyRun(ctx context.Context, v *volume, g, s int, o uint64, node Node, local uint16, j join) error {
	mu := r.lock(v, g, o)
	mu.Lock()
	defer mu.Unlock()
	if j.done.Load() < o {
		return fmt.Errorf("a write to the rebuilt rows failed at the new node")
	}
	rw := r.row(v, maxRunBytes)
	defer r.release(rw)
	if err := r.gather(ctx, v, g, o, rw); err != nil {
		return err
	}
	if !isZero(rw.shards[s]) {
		if err := node.WriteAt(ctx, local, v.p.Load().NodeOffset(g, s, o), rw.shards[s]); err != nil {
			return err
		}
		r.RepairBytes.Add(maxRunBytes)
	}
	j.done.Store(o + maxRunBytes)
	return nil
}

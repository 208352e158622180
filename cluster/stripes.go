package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/internal/units"
)

// DefaultExtentBytes is the unit of placement of a replicated volume:
// small enough that a 1 GiB volume spreads over a handful of nodes
// (64 extents), large enough that its map stays a few KiB in etcd and a
// repair moves whole MiB-sized chunks.
const DefaultExtentBytes = 16 << 20

// Stripes is the placement of a replicated volume: its bytes are cut in
// extents of ExtentBytes, and extent i lives at the nodes Extents[i] (at
// the same offsets, in a volume of the same name at each node). Epoch
// counts changes; hosts and agents compare it to know they act on the
// newest map.
type Stripes struct {
	Epoch       uint64     `json:"epoch"`
	ExtentBytes uint64     `json:"extent_bytes"`
	Replicas    int        `json:"replicas"` // wanted per extent
	Extents     [][]string `json:"extents"`
	// Joining, per extent, lists nodes a repair is copying the extent to:
	// they take its writes but are not read until promoted.
	Joining [][]string `json:"joining,omitempty"`
	// Moves are extents an operator asked to move (pd3 node drain, pd3
	// cluster rebalance); the volume's host carries them out.
	Moves []Move `json:"moves,omitempty"`
}

// Move asks for extent's replica at node From to go to node To.
type Move struct {
	Extent int    `json:"extent"`
	From   string `json:"from"`
	To     string `json:"to"`
}

// AddMoves records moves of volume name's extents; a move of an extent
// away from a node already asked for is kept as it was.
func AddMoves(ctx context.Context, cli *clientv3.Client, cluster, name string, moves []Move) (Stripes, error) {
	return UpdateStripes(ctx, cli, cluster, name, func(s *Stripes) (bool, error) {
		changed := false
		for _, m := range moves {
			if m.Extent >= len(s.Extents) || !slices.Contains(s.Extents[m.Extent], m.From) {
				return false, fmt.Errorf("cluster: volume %q extent %d is not at node %s", name, m.Extent, m.From)
			}
			if !slices.ContainsFunc(s.Moves, func(o Move) bool { return o.Extent == m.Extent && o.From == m.From }) {
				s.Moves = append(s.Moves, m)
				changed = true
			}
		}
		return changed, nil
	})
}

// DoneMove forgets move m of volume name: carried out, or moot.
func DoneMove(ctx context.Context, cli *clientv3.Client, cluster, name string, m Move) (Stripes, error) {
	return UpdateStripes(ctx, cli, cluster, name, func(s *Stripes) (bool, error) {
		n := len(s.Moves)
		s.Moves = slices.DeleteFunc(slices.Clone(s.Moves), func(o Move) bool { return o == m })
		return len(s.Moves) != n, nil
	})
}

// Writers are the nodes every write to extent e must reach: its replicas
// and the nodes joining it.
func (s *Stripes) Writers(e int) []string {
	if j := s.joining(e); len(j) > 0 {
		return append(slices.Clone(s.Extents[e]), j...)
	}
	return s.Extents[e]
}

// Repairing counts the extents with a node joining.
func (s *Stripes) Repairing() int {
	n := 0
	for _, j := range s.Joining {
		if len(j) > 0 {
			n++
		}
	}
	return n
}

// Clone is a deep copy, for a caller that changes it.
func (s Stripes) Clone() Stripes {
	s.Extents = cloneLists(s.Extents)
	s.Joining = cloneLists(s.Joining)
	s.Moves = slices.Clone(s.Moves)
	return s
}

func cloneLists(l [][]string) [][]string {
	if l == nil {
		return nil
	}
	out := make([][]string, len(l))
	for i := range l {
		out[i] = slices.Clone(l[i])
	}
	return out
}

// Extent is the index of the extent holding byte off.
func (s *Stripes) Extent(off uint64) int { return int(off / s.ExtentBytes) }

// Nodes are the ids of every node holding or joining some extent, sorted.
func (s *Stripes) Nodes() []string {
	var ids []string
	for _, e := range append(slices.Clone(s.Extents), s.Joining...) {
		for _, id := range e {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// Degraded counts the extents with fewer replicas than wanted, and the
// extents with none (lost).
func (s *Stripes) Degraded() (degraded, lost int) {
	for _, e := range s.Extents {
		if len(e) < s.Replicas {
			degraded++
		}
		if len(e) == 0 {
			lost++
		}
	}
	return degraded, lost
}

// PlaceStripes places a volume of size bytes in extents of extentBytes,
// each on r distinct nodes up (fewer if fewer are up), by power of two
// choices on free memory, counting what this placement has put on each
// node so far: the extents spread over the nodes in proportion to their
// room, where rendezvous hashing would place by name and ignore how full
// a node is. pick(n) returns a random int in [0, n).
func PlaceStripes(nodes []Node, size, extentBytes uint64, r int, pick func(int) int) (Stripes, error) {
	if extentBytes == 0 || extentBytes%(1<<20) != 0 {
		return Stripes{}, fmt.Errorf("cluster: extent size %d: want a whole number of MiB", extentBytes)
	}
	var up []Node
	for _, n := range nodes {
		if n.Up && !n.Draining {
			up = append(up, n)
		}
	}
	if len(up) == 0 || r < 1 {
		return Stripes{}, fmt.Errorf("%w: %d nodes known, none up and not draining", ErrNoNode, len(nodes))
	}
	r = min(r, len(up))
	placed := make(map[string]uint64)
	free := func(n Node) uint64 {
		if n.Capacity == 0 {
			return ^uint64(0) - placed[n.ID]
		}
		used := n.Stored + placed[n.ID]
		return n.Capacity - min(n.Capacity, used)
	}
	count := (size + extentBytes - 1) / extentBytes
	s := Stripes{Epoch: 1, ExtentBytes: extentBytes, Replicas: r, Extents: make([][]string, count)}
	for i := range s.Extents {
		var fit []Node
		for _, n := range up {
			if free(n) >= extentBytes {
				fit = append(fit, n)
			}
		}
		if len(fit) < r {
			room := make([]string, 0, len(up))
			for _, n := range up {
				left := "no limit"
				if n.Capacity > 0 {
					left = fmt.Sprintf("%s of %s free", units.FormatSize(n.Capacity-min(n.Capacity, n.Stored)), units.FormatSize(n.Capacity))
				}
				room = append(room, n.ID+" "+left)
			}
			return Stripes{}, fmt.Errorf("%w: %s as %d extents of %s, %s each, does not fit (extent %d found %d with room); room: %s; add a memory node or raise a node's capacity",
				ErrNoNode, units.FormatSize(size), count, units.FormatSize(extentBytes), units.Count(r, "copy", "copies"), i, len(fit), strings.Join(room, ", "))
		}
		reps := make([]string, 0, r)
		for len(reps) < r {
			a, b := fit[pick(len(fit))], fit[pick(len(fit))]
			if free(b) > free(a) {
				a = b
			}
			reps = append(reps, a.ID)
			placed[a.ID] += extentBytes
			fit = slices.DeleteFunc(fit, func(n Node) bool { return n.ID == a.ID })
		}
		s.Extents[i] = reps
	}
	return s, nil
}

// ErrLastReplica: the replica to drop is the extent's last; its data
// would be gone, so the caller must fail the I/O instead.
var ErrLastReplica = errors.New("cluster: the extent's last replica")

// UpdateStripes changes volume name's stripe map with fn in a transaction
// on the record as read, retried when another change came first, and
// returns the new map; fn reports whether it changed anything.
func UpdateStripes(ctx context.Context, cli *clientv3.Client, cluster, name string, fn func(s *Stripes) (bool, error)) (Stripes, error) {
	rec, err := updateRecord(ctx, cli, cluster, name, func(rec *VolumeRecord) (bool, error) {
		if rec.Stripes == nil {
			return false, fmt.Errorf("cluster: volume %q is not replicated", name)
		}
		changed, err := fn(rec.Stripes)
		if changed && err == nil {
			rec.Stripes.Epoch++
		}
		return changed, err
	})
	if rec.Stripes == nil {
		return Stripes{}, err
	}
	return *rec.Stripes, err
}

// updateRecord changes volume name's record with fn (which reports
// whether it changed anything), as one compare-and-swap, retried if the
// record changed meanwhile; it returns the record as recorded (or as fn
// left it, with fn's error).
func updateRecord(ctx context.Context, cli *clientv3.Client, cluster, name string, fn func(rec *VolumeRecord) (bool, error)) (VolumeRecord, error) {
	for {
		rec, err := GetVolume(ctx, cli, cluster, name)
		if err != nil {
			return VolumeRecord{}, err
		}
		switch changed, err := fn(&rec); {
		case err != nil, !changed:
			return rec, err
		}
		err = update(ctx, cli, cluster, &rec)
		if errors.Is(err, ErrRaced) {
			continue
		}
		return rec, err
	}
}

// DropReplica takes node off extent of volume name's stripe map, as a
// replica or as one joining, and returns the new map. It is how the only
// writer of a volume keeps a replica that missed a write from ever being
// read: a write is acknowledged only once the map no longer lists a
// replica that did not take it.
func DropReplica(ctx context.Context, cli *clientv3.Client, cluster, name string, extent int, node string) (Stripes, error) {
	return UpdateStripes(ctx, cli, cluster, name, func(s *Stripes) (bool, error) { return s.Drop(extent, node) })
}

// Drop takes node off extent, as a replica or as a node joining it; it
// reports false if node was neither (dropped already).
func (s *Stripes) Drop(extent int, node string) (bool, error) {
	if extent >= len(s.Extents) {
		return false, fmt.Errorf("cluster: no extent %d", extent)
	}
	if i := slices.Index(s.joining(extent), node); i >= 0 {
		s.Joining[extent] = slices.Delete(slices.Clone(s.Joining[extent]), i, i+1)
		return true, nil
	}
	i := slices.Index(s.Extents[extent], node)
	if i < 0 {
		return false, nil
	}
	if len(s.Extents[extent]) == 1 {
		return false, fmt.Errorf("%w: extent %d at node %s", ErrLastReplica, extent, node)
	}
	s.Extents[extent] = slices.Delete(slices.Clone(s.Extents[extent]), i, i+1)
	return true, nil
}

// AddJoining lists node as joining extent: it takes every write to the
// extent from now on while a repair copies the rest to it, and is read
// from only once Promote made it a replica.
func AddJoining(ctx context.Context, cli *clientv3.Client, cluster, name string, extent int, node string) (Stripes, error) {
	return UpdateStripes(ctx, cli, cluster, name, func(s *Stripes) (bool, error) { return true, s.Join(extent, node) })
}

// Join lists node as joining extent.
func (s *Stripes) Join(extent int, node string) error {
	if extent >= len(s.Extents) {
		return fmt.Errorf("cluster: no extent %d", extent)
	}
	if slices.Contains(s.Extents[extent], node) || slices.Contains(s.joining(extent), node) {
		return fmt.Errorf("cluster: extent %d is at node %s already", extent, node)
	}
	for len(s.Joining) < len(s.Extents) {
		s.Joining = append(s.Joining, nil)
	}
	s.Joining[extent] = append(slices.Clone(s.Joining[extent]), node)
	return nil
}

// Promote makes node, joining extent, one of its replicas.
func Promote(ctx context.Context, cli *clientv3.Client, cluster, name string, extent int, node string) (Stripes, error) {
	return UpdateStripes(ctx, cli, cluster, name, func(s *Stripes) (bool, error) { return true, s.Promote(extent, node) })
}

// Promote makes node, joining extent, one of its replicas.
func (s *Stripes) Promote(extent int, node string) error {
	i := slices.Index(s.joining(extent), node)
	if i < 0 {
		return fmt.Errorf("cluster: extent %d: node %s is not joining it (dropped meanwhile)", extent, node)
	}
	s.Joining[extent] = slices.Delete(slices.Clone(s.Joining[extent]), i, i+1)
	s.Extents[extent] = append(slices.Clone(s.Extents[extent]), node)
	return nil
}

// joining is the nodes joining extent e.
func (s *Stripes) joining(e int) []string {
	if e < len(s.Joining) {
		return s.Joining[e]
	}
	return nil
}

// NextVolumeID hands out the id a replicated volume's pages carry in
// their keys, unique in the cluster (a node-local id would not be: each
// node numbers its own volumes). Ids run from 1 to 65535.
func NextVolumeID(ctx context.Context, cli *clientv3.Client, cluster string) (uint16, error) {
	key := prefix(cluster) + "next-volume-id"
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return 0, fmt.Errorf("cluster: volume ids: %w", err)
		}
		next, rev := uint64(1), int64(0)
		if len(resp.Kvs) > 0 {
			if next, err = strconv.ParseUint(string(resp.Kvs[0].Value), 10, 32); err != nil {
				return 0, fmt.Errorf("cluster: volume ids: %s: %w", resp.Kvs[0].Value, err)
			}
			rev = resp.Kvs[0].ModRevision
		}
		if next == 0 || next > 0xffff {
			return 0, errors.New("cluster: volume ids: all 65535 handed out")
		}
		t, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatUint(next+1, 10))).Commit()
		if err != nil {
			return 0, fmt.Errorf("cluster: volume ids: %w", err)
		}
		if t.Succeeded {
			return uint16(next), nil
		}
	}
}

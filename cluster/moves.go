package cluster

import (
	"fmt"
	"slices"
)

// Moves that change where extents live: off a node being drained, and
// evening out the cluster after nodes join. They are only asked for here;
// the volume's host carries them out (replica).

// MovesOff asks for every extent of s at node id to move to another node
// up, not draining and not holding it: the freer of two drawn by pick
// (Place), counting what these moves add. need is what one extent weighs
// at its new node.
func MovesOff(nodes []Node, s Stripes, need uint64, id string, pick func(int) int) ([]Move, error) {
	var moves []Move
	added := map[string]uint64{}
	for e, reps := range s.Extents {
		if !slices.Contains(reps, id) {
			continue
		}
		var fit []Node
		for _, n := range nodes {
			if n.Up && !n.Draining && !slices.Contains(s.Writers(e), n.ID) {
				n.Stored += added[n.ID]
				fit = append(fit, n)
			}
		}
		to, err := Place(fit, need, pick)
		if err != nil {
			return nil, fmt.Errorf("extent %d: %w", e, err)
		}
		added[to.ID] += need
		moves = append(moves, Move{Extent: e, From: id, To: to.ID})
	}
	return moves, nil
}

// RebalanceMoves evens out the extents of replicated volumes over the
// nodes up and not draining: while one holds more than its share (the
// ceiling of the average) and another less than the floor, one extent of
// the fullest goes to the emptiest that does not hold it. The moves are
// by volume name.
func RebalanceMoves(nodes []Node, vols []VolumeRecord) map[string][]Move {
	count := map[string]int{}
	var ids []string
	for _, n := range nodes {
		if n.Up && !n.Draining {
			count[n.ID] = 0
			ids = append(ids, n.ID)
		}
	}
	if len(ids) < 2 {
		return nil
	}
	type loc struct {
		vol string
		e   int
	}
	held := map[string][]loc{}
	maps := map[string]*Stripes{}
	total := 0
	for _, v := range vols {
		if v.Stripes == nil {
			continue
		}
		s := v.Stripes.Clone()
		maps[v.Name] = &s
		for e, reps := range s.Extents {
			for _, id := range reps {
				if _, ok := count[id]; ok {
					count[id]++
					held[id] = append(held[id], loc{v.Name, e})
					total++
				}
			}
		}
	}
	lo, hi := total/len(ids), (total+len(ids)-1)/len(ids)
	out := map[string][]Move{}
	for {
		slices.SortFunc(ids, func(a, b string) int { return count[a] - count[b] })
		empty, full := ids[0], ids[len(ids)-1]
		if count[full] <= hi && count[empty] >= lo {
			return out
		}
		moved := false
		for i, l := range held[full] {
			s := maps[l.vol]
			if slices.Contains(s.Writers(l.e), empty) {
				continue
			}
			out[l.vol] = append(out[l.vol], Move{Extent: l.e, From: full, To: empty})
			s.Extents[l.e] = append(slices.DeleteFunc(slices.Clone(s.Extents[l.e]), func(id string) bool { return id == full }), empty)
			held[full] = slices.Delete(held[full], i, i+1)
			held[empty] = append(held[empty], l)
			count[full]--
			count[empty]++
			moved = true
			break
		}
		if !moved {
			return out // every extent of the fullest is at the emptiest already
		}
	}
}

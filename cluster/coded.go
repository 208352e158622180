package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Scheme is K data shards protected by M parity shards: a row survives the
// loss of any M of its K+M shards, for (K+M)/K of its bytes in memory.
type Scheme struct {
	K int `json:"k"`
	M int `json:"m"`
}

// Bounds of a scheme: Reed-Solomon over GF(2^8) allows 256 shards; a
// volume wider than a rack of memory nodes is not one we can place.
const (
	MaxData   = 32
	MaxParity = 8
)

// ParseScheme reads "K+M", as --ec takes it.
func ParseScheme(s string) (Scheme, error) {
	k, m, ok := strings.Cut(s, "+")
	K, errK := strconv.Atoi(k)
	M, errM := strconv.Atoi(m)
	if !ok || errK != nil || errM != nil {
		return Scheme{}, fmt.Errorf("erasure code %q: want K+M, data and parity shards, e.g. 4+2", s)
	}
	sch := Scheme{K: K, M: M}
	return sch, sch.Check()
}

// Check says what is wrong with a scheme, if anything.
func (s Scheme) Check() error {
	if s.K < 1 || s.K > MaxData || s.M < 1 || s.M > MaxParity {
		return fmt.Errorf("erasure code %s: want 1 to %d data shards and 1 to %d parity shards", s, MaxData, MaxParity)
	}
	return nil
}

func (s Scheme) String() string { return strconv.Itoa(s.K) + "+" + strconv.Itoa(s.M) }

// Shards is K+M.
func (s Scheme) Shards() int { return s.K + s.M }

// Coded is the placement of an erasure-coded volume; the control plane
// records it. The volume's bytes are cut in extents of ExtentBytes, and
// every K consecutive extents make a group (the last group's missing
// extents read as zeroes and are never stored). Shard s < K of group g is
// data extent g*K+s; shards K..K+M-1 are its parity, byte for byte: the
// byte at offset o of each parity shard is a Reed-Solomon code of the
// bytes at o of the group's data shards (a row). A read is one read from
// the one node holding the data shard, as Carbink's spans do.
//
// Groups[g][s] is the node holding shard s of group g, "" once the shard
// is lost (its node gone, or it missed a write): a lost shard is never
// read again, and repair rebuilds it elsewhere. Each node keeps its
// shards in one volume of the volume's name, shard s of group g at
// NodeOffset(g, s, 0).
type Coded struct {
	Scheme
	Epoch       uint64 `json:"epoch"`
	ExtentBytes uint64 `json:"extent_bytes"`
	// Extents is the number of data extents; data shards past it (in the
	// last group) are virtual: zeroes, never stored, never lost.
	Extents int        `json:"extents"`
	Groups  [][]string `json:"groups"`
	// Open is set while a host has the volume open for writing, and
	// cleared when it closes it with every write back. A host that finds
	// it set as it takes the volume over knows the last one stopped
	// without closing it: a row may hold data its parity does not code,
	// and the new host re-encodes the parity before serving.
	Open bool `json:"open,omitempty"`
}

// Errors of coded placement.
var (
	// ErrTooFewNodes: fewer nodes than K+M, so a group's shards cannot
	// each have their own.
	ErrTooFewNodes = errors.New("cluster: fewer memory nodes than shards in a group")
)

// PlaceCoded spreads a volume of size bytes over nodes: each group's K+M
// shards on distinct nodes, the groups rotated so that data and parity
// (and so reads and writes) fall evenly on every node.
func PlaceCoded(sch Scheme, size, extentBytes uint64, nodes []string) (Coded, error) {
	if err := sch.Check(); err != nil {
		return Coded{}, err
	}
	if len(nodes) < sch.Shards() {
		return Coded{}, fmt.Errorf("%w: %s needs %d, the cluster has %d", ErrTooFewNodes, sch, sch.Shards(), len(nodes))
	}
	if err := checkExtent(extentBytes); err != nil {
		return Coded{}, err
	}
	extents := int((size + extentBytes - 1) / extentBytes)
	p := Coded{Scheme: sch, Epoch: 1, ExtentBytes: extentBytes, Extents: extents}
	groups := (extents + sch.K - 1) / sch.K
	for g := range groups {
		row := make([]string, sch.Shards())
		for s := range row {
			row[s] = nodes[(g+s)%len(nodes)]
		}
		p.Groups = append(p.Groups, row)
	}
	return p, nil
}

// chunkBytes is a memory node's unit of allocation (memnode.ChunkSize):
// an extent is whole chunks, or a shard sharing a chunk with another slot
// would pay for the whole chunk at its node.
const chunkBytes = 1 << 20

func checkExtent(n uint64) error {
	if n == 0 || n%chunkBytes != 0 {
		return fmt.Errorf("cluster: extent of %d bytes: want a multiple of %d (a memory node's chunk)", n, chunkBytes)
	}
	return nil
}

// Locate names the shard and its offset that hold byte off of the volume.
func (p *Coded) Locate(off uint64) (g, s int, o uint64) {
	e := off / p.ExtentBytes
	return int(e / uint64(p.K)), int(e % uint64(p.K)), off % p.ExtentBytes
}

// Virtual says whether shard s of group g is a data shard past the
// volume's end: zeroes, never stored.
func (p *Coded) Virtual(g, s int) bool { return s < p.K && g*p.K+s >= p.Extents }

// NodeOffset is where byte o of shard s of group g lies in its node's
// volume.
func (p *Coded) NodeOffset(g, s int, o uint64) uint64 {
	return uint64(g*p.Shards()+s)*p.ExtentBytes + o
}

// NodeBytes is the size of the volume each node holds the shards in
// (sparse: a node stores only its own shards' written chunks).
func (p *Coded) NodeBytes() uint64 { return uint64(len(p.Groups)*p.Shards()) * p.ExtentBytes }

// Clone is a deep copy, for a caller that changes it.
func (p Coded) Clone() Coded {
	p.Groups = slices.Clone(p.Groups)
	for g := range p.Groups {
		p.Groups[g] = slices.Clone(p.Groups[g])
	}
	return p
}

// Drop records shard s of group g as lost; false if it was already.
func (p *Coded) Drop(g, s int) bool {
	if p.Groups[g][s] == "" {
		return false
	}
	p.Groups[g][s] = ""
	return true
}

// Health counts the groups that lost a shard (degraded: each lost
// shard's rows are read by decoding) and the groups that lost more than
// M (their lost data cannot be rebuilt).
func (p *Coded) Health() (degraded, lost int) {
	for g, row := range p.Groups {
		n := 0
		for s, id := range row {
			if id == "" && !p.Virtual(g, s) {
				n++
			}
		}
		if n > 0 {
			degraded++
		}
		if n > p.M {
			lost++
		}
	}
	return degraded, lost
}

// Nodes are the ids of every node holding a shard, sorted.
func (p *Coded) Nodes() []string {
	var ids []string
	for _, row := range p.Groups {
		for _, id := range row {
			if id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// Check says what is wrong with a recorded placement, if anything.
func (p *Coded) Check(size uint64) error {
	if err := p.Scheme.Check(); err != nil {
		return err
	}
	if err := checkExtent(p.ExtentBytes); err != nil {
		return err
	}
	if uint64(p.Extents)*p.ExtentBytes < size || len(p.Groups) != (p.Extents+p.K-1)/p.K {
		return fmt.Errorf("cluster: %d groups of %d extents place %d bytes; the volume has %d", len(p.Groups), p.Extents, uint64(p.Extents)*p.ExtentBytes, size)
	}
	for g, row := range p.Groups {
		if len(row) != p.Shards() {
			return fmt.Errorf("cluster: group %d has %d shards, %s wants %d", g, len(row), p.Scheme, p.Shards())
		}
		for s, id := range row {
			if id != "" && slices.Index(row, id) != s {
				return fmt.Errorf("cluster: group %d holds two shards at node %s", g, id)
			}
		}
	}
	return nil
}

// UpdateCoded changes erasure-coded volume name's placement with fn (which
// reports whether it changed anything), as one compare-and-swap of its
// record, retried if the record changed meanwhile; it returns the
// placement as recorded.
func UpdateCoded(ctx context.Context, cli *clientv3.Client, cluster, name string, fn func(p *Coded) (bool, error)) (Coded, error) {
	rec, err := updateRecord(ctx, cli, cluster, name, func(rec *VolumeRecord) (bool, error) {
		if rec.EC == nil {
			return false, fmt.Errorf("cluster: volume %q is not erasure-coded", name)
		}
		changed, err := fn(rec.EC)
		if changed && err == nil {
			rec.EC.Epoch++
		}
		return changed, err
	})
	if rec.EC == nil {
		return Coded{}, err
	}
	return *rec.EC, err
}

// DropShard records shard s of group g of volume name lost: how the only
// writer of a coded volume keeps a shard that missed a write from ever
// being read.
func DropShard(ctx context.Context, cli *clientv3.Client, cluster, name string, g, s int) (Coded, error) {
	return UpdateCoded(ctx, cli, cluster, name, func(p *Coded) (bool, error) {
		if g >= len(p.Groups) || s >= p.Shards() {
			return false, fmt.Errorf("cluster: volume %q has no shard %d of group %d", name, s, g)
		}
		return p.Drop(g, s), nil
	})
}

// SetShard records node as the holder of shard s of group g of volume
// name: a repair rebuilt the lost shard there.
func SetShard(ctx context.Context, cli *clientv3.Client, cluster, name string, g, s int, node string) (Coded, error) {
	return UpdateCoded(ctx, cli, cluster, name, func(p *Coded) (bool, error) {
		if g >= len(p.Groups) || s >= p.Shards() {
			return false, fmt.Errorf("cluster: volume %q has no shard %d of group %d", name, s, g)
		}
		if p.Groups[g][s] == node {
			return false, nil
		}
		if p.Groups[g][s] != "" || slices.Contains(p.Groups[g], node) {
			return false, fmt.Errorf("cluster: volume %q group %d: shard %d is at %q, and node %s may not hold two", name, g, s, p.Groups[g][s], node)
		}
		p.Groups[g][s] = node
		return true, nil
	})
}

// SetOpen records whether a host has volume name open for writing
// (Coded.Open); it returns whether it was open before.
func SetOpen(ctx context.Context, cli *clientv3.Client, cluster, name string, open bool) (was bool, err error) {
	// Not a change of placement: the epoch stays.
	_, err = updateRecord(ctx, cli, cluster, name, func(rec *VolumeRecord) (bool, error) {
		if rec.EC == nil {
			return false, fmt.Errorf("cluster: volume %q is not erasure-coded", name)
		}
		was = rec.EC.Open
		rec.EC.Open = open
		return was != open, nil
	})
	return was, err
}

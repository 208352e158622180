package ec

import (
	"bytes"
	"context"
	"fmt"
)

// Resync re-encodes the parity of every row of volume vol from its data
// shards and rewrites the parity runs that differ, for a volume whose last
// host stopped without closing it: that host may have written a row's
// data and not yet its parity (or the reverse), and a later loss would
// decode such a row into wrong bytes. It returns how many parity runs it
// rewrote. A data shard that cannot be read is decoded from the row as it
// stands (the best there is: a torn row that also lost a shard is the
// write hole of any erasure code).
func (r *Remote) Resync(ctx context.Context, vol uint16) (rewritten int, err error) {
	v, err := r.volume(vol)
	if err != nil {
		return 0, err
	}
	p := v.p.Load()
	for g := range p.Groups {
		for o := uint64(0); o < p.ExtentBytes; o += maxRunBytes {
			n, err := r.resyncRun(ctx, v, g, o)
			if err != nil {
				return rewritten, fmt.Errorf("ec: volume %q: re-encoding group %d at %d: %w", v.Name, g, o, err)
			}
			rewritten += n
		}
	}
	return rewritten, nil
}

// resyncRun re-encodes run o of group g's parity under the row's lock.
func (r *Remote) resyncRun(ctx context.Context, v *volume, g int, o uint64) (int, error) {
	mu := r.lock(v, g, o)
	mu.Lock()
	defer mu.Unlock()
	rw := r.row(v, maxRunBytes)
	defer r.release(rw)
	if err := r.gather(ctx, v, g, o, rw); err != nil {
		return 0, err
	}
	p := v.p.Load()
	old := make([][]byte, p.M)
	for j := range p.M {
		old[j] = bytes.Clone(rw.shards[p.K+j])
	}
	if err := v.enc.Encode(rw.shards); err != nil {
		return 0, err
	}
	n := 0
	for j := range p.M {
		x := p.K + j
		if bytes.Equal(old[j], rw.shards[x]) {
			continue
		}
		node, local, _ := r.node(v, p, g, x)
		if node == nil {
			continue
		}
		if err := node.WriteAt(ctx, local, p.NodeOffset(g, x, o), rw.shards[x]); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

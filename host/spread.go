package host

import (
	"context"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/replica"
)

// spread is the remote of a host whose volumes live over many memory
// nodes: erasure-coded volumes go to coded, every other (replicated
// volumes and the filesystem's group) to rep. Each capability is its own
// method, as pagestore's contract asks of a wrapper.
type spread struct {
	rep   *replica.Remote
	coded *ec.Remote
}

var (
	_ dpu.Conn                   = spread{}
	_ pagestore.Remote           = spread{}
	_ pagestore.Trimmer          = spread{}
	_ pagestore.Mapper           = spread{}
	_ pagestore.PagesReader      = spread{}
	_ pagestore.AsyncReader      = spread{}
	_ pagestore.AsyncPagesReader = spread{}
)

// isCoded says whether volume vol is erasure-coded.
func (s spread) isCoded(vol uint16) bool { return s.coded != nil && s.coded.Has(vol) }

// conn is the dpu.Conn serving volume vol.
func (s spread) conn(vol uint16) dpu.Conn {
	if s.isCoded(vol) {
		return s.coded
	}
	return s.rep
}

func (s spread) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	if s.isCoded(k.Volume()) {
		return s.coded.ReadPage(ctx, k, dst)
	}
	return s.rep.ReadPage(ctx, k, dst)
}

func (s spread) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	if s.isCoded(first.Volume()) {
		return s.coded.ReadPages(ctx, first, p)
	}
	return s.rep.ReadPages(ctx, first, p)
}

func (s spread) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	return s.WriteQueued(ctx, keys, pages, nil)
}

// WriteQueued writes a batch that may hold both kinds of volume: the coded
// pages first (done once written), then the replicated ones, whose
// queued is the batch's.
func (s spread) WriteQueued(ctx context.Context, keys []pageid.Key, pages [][]byte, queued func()) error {
	if s.coded == nil {
		return s.rep.WriteQueued(ctx, keys, pages, queued)
	}
	var ck, rk []pageid.Key
	var cp, rp [][]byte
	for i, k := range keys {
		if s.isCoded(k.Volume()) {
			ck, cp = append(ck, k), append(cp, pages[i])
		} else {
			rk, rp = append(rk, k), append(rp, pages[i])
		}
	}
	var cerr error
	if len(ck) > 0 {
		if len(rk) == 0 {
			return s.coded.WriteQueued(ctx, ck, cp, queued)
		}
		cerr = s.coded.WritePages(ctx, ck, cp)
	}
	rerr := s.rep.WriteQueued(ctx, rk, rp, queued)
	if cerr != nil {
		return cerr
	}
	return rerr
}

func (s spread) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return s.conn(vol).TrimQueued(ctx, vol, off, n, nil)
}

func (s spread) TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error {
	return s.conn(vol).TrimQueued(ctx, vol, off, n, queued)
}

// Map implements pagestore.Mapper: a coded volume is all data (its
// shards' holes are not mapped yet).
func (s spread) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	if !s.isCoded(vol) {
		return s.rep.Map(ctx, vol, off, n, fn)
	}
	fn(off, n, false)
	return nil
}

func (s spread) PrefetchFn(k pageid.Key, page []byte, done func(error)) {
	s.conn(k.Volume()).PrefetchFn(k, page, done)
}

func (s spread) ReadOneFn(vol uint16, off uint64, p []byte, done func(error)) {
	s.conn(vol).ReadOneFn(vol, off, p, done)
}

func (s spread) ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call {
	return s.conn(vol).ReadAsync(ctx, vol, off, p)
}

func (s spread) Span(first pageid.Key, n int) int { return s.conn(first.Volume()).Span(first, n) }

func (s spread) ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return s.conn(vol).ReadAt(ctx, vol, off, p)
}

func (s spread) ReadFn(vol uint16, off uint64, p []byte, done func(error)) {
	s.conn(vol).ReadFn(vol, off, p, done)
}

// ReadPageAsync implements pagestore.AsyncReader: without an agent, a
// cluster host's cache reads a miss as a one-node host's does, finished by
// the node connection's reader rather than by a goroutine that waits
// (docs/decisions.md, 32).
func (s spread) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	if s.isCoded(k.Volume()) {
		s.coded.ReadPageAsync(k, dst, done)
		return
	}
	s.rep.ReadPageAsync(k, dst, done)
}

// ReadPagesAsync implements pagestore.AsyncPagesReader.
func (s spread) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	if s.isCoded(first.Volume()) {
		s.coded.ReadPagesAsync(first, p, done)
		return
	}
	s.rep.ReadPagesAsync(first, p, done)
}

func (s spread) Fence(ctx context.Context, vol uint16, token uint64) error {
	return s.conn(vol).Fence(ctx, vol, token)
}

package pagestore

import (
	"context"
	"github.com/pd3-go/pd3/pageid"
)

// This file is the whole contract between the Store and where its pages
// live. A Remote must implement Remote; each other interface here is an
// optional capability the Store finds with a type assertion, and its
// comment says what the Store does when a Remote lacks it.
//
// A wrapper Remote (a prefetcher, a fault injector, a replicator) must
// declare every capability it forwards with its own method, never by
// embedding: an embedded implementation's methods would be found by the
// Store's assertions and bypass the wrapper. remotetest.Run checks any
// Remote against this contract.

// Remote is where pages live when they are not cached: a memory node
// (memnode.Remote), the DPU agent (dpu.Engine in process, split.Link over
// shared memory), a host-side prefetcher in front of either
// (dpu.LeapRemote), or memory (MemRemote, for tests and baselines).
// Implementations are safe for concurrent use. A page never written reads
// as zeroes. A Remote that knows its volumes (each one over memory nodes)
// fails a call on a volume it does not serve with pageid.ErrNoVolume, one
// past its volume's end with pageid.ErrOutOfRange, and one whose context
// is done with an error (remotetest's Bounded).
type Remote interface {
	// ReadPage fills dst (one page) with page k.
	ReadPage(ctx context.Context, k pageid.Key, dst []byte) error
	// WritePages stores pages[i] as keys[i] and returns once all of them
	// are at the remote: a later ReadPage from any reader sees them. The
	// keys of one call are distinct and no two calls write the same key
	// at once (the Store writes each dirty frame once, under its lock),
	// so a Remote may land the pages of a call in any order.
	WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error
}

// PagesReader reads consecutive pages of a volume with one request.
//
// Absent: a multi-page miss (ReadRange, an NBD or FUSE read) loads its
// pages with one ReadPage each, up to maxParallelMisses at a time.
type PagesReader interface {
	// ReadPages fills p (a whole number of pages) with the pages from
	// first on.
	ReadPages(ctx context.Context, first pageid.Key, p []byte) error
}

// StreamReader reads consecutive pages for ReadStream, which does not
// cache them: a remote that keeps track of what the host holds (the DPU
// agent's Host View) must not count these pages as held, or it would
// never prefetch them again. StreamTook tells it of a page the stream
// took from the Loading Zone instead, which the agent placed there as
// the host's.
//
// Absent: ReadStream reads them with ReadPages (or a ReadPage each).
type StreamReader interface {
	ReadStreamPages(ctx context.Context, first pageid.Key, p []byte) error
	StreamTook(k pageid.Key)
}

// AsyncReader reads a page without blocking the caller. done is called
// exactly once with the result: later on another goroutine (the remote's
// connection reader), or at once if the read could not be started. done
// must not block.
//
// Absent: GetAsync answers every miss with ErrWouldBlock, and the caller
// takes the blocking path (Get from a goroutine that may wait).
type AsyncReader interface {
	ReadPageAsync(k pageid.Key, dst []byte, done func(error))
}

// AsyncPagesReader reads consecutive pages without blocking the caller,
// with one request, as AsyncReader reads one: done is called exactly
// once, later on another goroutine or at once if the read could not be
// started, and must not block.
//
// Absent: GetAsync reads a run of missing pages with one ReadPageAsync
// each (or answers ErrWouldBlock without an AsyncReader either).
type AsyncPagesReader interface {
	ReadPagesAsync(first pageid.Key, p []byte, done func(error))
}

// Trimmer drops pages: TRIM frees whole memory-node chunks.
//
// Absent: Trim and zeroing write zero pages to the Remote instead, so the
// range reads as zeroes but keeps its memory.
type Trimmer interface {
	// Trim discards n bytes at byte offset off of volume vol; they read as
	// zeroes afterwards. The Store passes whole pages only (it zeroes
	// partial pages itself).
	Trim(ctx context.Context, vol uint16, off, n uint64) error
}

// Mapper says which ranges of a volume hold memory at the remote, for
// NBD's BLOCK_STATUS (base:allocation): copy and backup tools skip holes.
// It reports what the remote stores, not the Store's dirty pages; the
// Store writes those back before it asks (Store.Map).
//
// Absent: Store.Map reports every range as data.
type Mapper interface {
	// Map calls fn for consecutive runs covering the n bytes at byte
	// offset off of volume vol, in order: hole says the run holds no
	// memory and reads as zeroes. A remote may answer at a coarser grain
	// than pages (a memory node: 1 MiB chunks); a run it calls data may
	// read as zeroes too.
	Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error
}

// Prefetched is the Loading Zone as the miss path sees it: pages fetched
// ahead of need. CheckAndReturn copies page k into dst and returns
// pageid.Size on a hit, 0 on a miss; it never blocks. It is an Option, not a
// Remote capability, because it is consulted before the Remote.
//
// Absent (Options.Prefetched nil): every miss reads the Remote.
type Prefetched interface {
	CheckAndReturn(k pageid.Key, dst []byte) int
}

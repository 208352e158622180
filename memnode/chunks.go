package memnode

import (
	"sync"
	"sync/atomic"
)

// segChunks is the number of chunk slots in one segment of a sparse
// table: 1 GiB of volume per segment.
const segChunks = 1024

// denseChunks is the largest volume, in chunks, whose slots are allocated
// up front (64 GiB: 512 KiB of slots). Larger volumes are sparse files of
// up to terabytes, mostly empty, whose slots come in segments on first
// write.
const denseChunks = 1 << 16

// chunkTable maps a chunk index of a volume to its chunk. A chunk is
// allocated on first write and then stays where it is for the life of the
// volume, so a table can grow (RESIZE) by publishing a new view that
// points at the same chunks: a request that loaded the old view still
// reaches the chunk every later request does.
//
// Lookups in a dense table load two pointers and take no lock; a sparse
// table adds a map lookup under a read lock, paid only by volumes too
// large for a slice.
type chunkTable struct {
	view atomic.Pointer[chunkView]
	// mu guards the sparse map and serialises allocation of slots with
	// growth, so a chunk allocated while the table grows lands in the
	// view that survives.
	mu sync.RWMutex
}

// chunkView is one generation of a table: dense (slots) or sparse (segs).
type chunkView struct {
	slots []atomic.Pointer[chunk]
	segs  map[uint64]*segment // nil for dense views; guarded by chunkTable.mu
}

type segment [segChunks]atomic.Pointer[chunk]

func newChunkTable(size uint64) *chunkTable {
	t := new(chunkTable)
	t.view.Store(newView(size))
	return t
}

func newView(size uint64) *chunkView {
	n := (size + ChunkSize - 1) / ChunkSize
	if n <= denseChunks {
		return &chunkView{slots: make([]atomic.Pointer[chunk], n)}
	}
	return &chunkView{segs: make(map[uint64]*segment)}
}

// get returns chunk i, which the caller checked lies within the volume's
// size as published after the table grew to it. A chunk never written is
// nil unless alloc is set, so reads of holes allocate nothing.
func (t *chunkTable) get(i uint64, alloc bool) *chunk {
	v := t.view.Load()
	var c *chunk
	if v.segs == nil {
		c = v.slots[i].Load()
	} else {
		t.mu.RLock()
		if seg := v.segs[i/segChunks]; seg != nil {
			c = seg[i%segChunks].Load()
		}
		t.mu.RUnlock()
	}
	if c != nil || !alloc {
		return c
	}
	return t.alloc(i)
}

// holeEnd returns the first chunk index at or after i that may hold a
// chunk: past a sparse table's missing segment, else i. A trim of
// terabytes (a file's volume past its size) skips what was never written
// a segment at a time.
func (t *chunkTable) holeEnd(i uint64) uint64 {
	v := t.view.Load()
	if v.segs == nil {
		return i
	}
	t.mu.RLock()
	seg := v.segs[i/segChunks]
	t.mu.RUnlock()
	if seg != nil {
		return i
	}
	return (i/segChunks + 1) * segChunks
}

// alloc makes chunk i, once per chunk of a volume's life: a lock here
// costs nothing that matters.
func (t *chunkTable) alloc(i uint64) *chunk {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot := t.view.Load().slot(i)
	c := slot.Load()
	if c == nil {
		c = new(chunk)
		slot.Store(c)
	}
	return c
}

// slot returns the slot of chunk i, adding its segment in a sparse view;
// chunkTable.mu held for writing.
func (v *chunkView) slot(i uint64) *atomic.Pointer[chunk] {
	if v.segs == nil {
		return &v.slots[i]
	}
	seg := v.segs[i/segChunks]
	if seg == nil {
		seg = new(segment)
		v.segs[i/segChunks] = seg
	}
	return &seg[i%segChunks]
}

// grow makes the table cover size bytes; the caller publishes the new
// size only after grow returns, so no request indexes past the view it
// loads. Shrinking is not a table operation (chunks past the end would
// need freeing); callers refuse it.
func (t *chunkTable) grow(size uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.view.Load()
	if old.segs != nil {
		return // a sparse table covers any size
	}
	nv := newView(size)
	if nv.segs == nil && len(nv.slots) <= len(old.slots) {
		return
	}
	for i := range old.slots {
		if c := old.slots[i].Load(); c != nil {
			nv.slot(uint64(i)).Store(c)
		}
	}
	t.view.Store(nv)
}

// each calls fn on every chunk that exists, in no particular order for
// sparse tables.
func (t *chunkTable) each(fn func(i uint64, c *chunk)) {
	v := t.view.Load()
	if v.segs == nil {
		for i := range v.slots {
			if c := v.slots[i].Load(); c != nil {
				fn(uint64(i), c)
			}
		}
		return
	}
	t.mu.RLock()
	segs := make(map[uint64]*segment, len(v.segs))
	for k, s := range v.segs {
		segs[k] = s
	}
	t.mu.RUnlock()
	for k, seg := range segs {
		for j := range seg {
			if c := seg[j].Load(); c != nil {
				fn(k*segChunks+uint64(j), c)
			}
		}
	}
}

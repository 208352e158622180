package memnode

import "sync"

// segChunks is the number of chunk slots in one segment of a sparse
// table: 1 GiB of volume per segment.
const segChunks = 1024

// denseChunks is the largest volume, in chunks, whose slots are allocated
// up front (64 GiB: 3 MiB of slots). Larger volumes are sparse files of up
// to terabytes, mostly empty, whose slots come in segments on first write.
const denseChunks = 1 << 16

// chunkTable maps a chunk index of a volume to its chunk. Dense tables are
// a slice indexed without a lock; sparse ones add a map lookup under a
// read lock, paid only by volumes too large for a slice.
type chunkTable struct {
	dense []chunk

	mu   sync.RWMutex // guards segs
	segs map[uint64]*[segChunks]chunk
}

func newChunkTable(size uint64) chunkTable {
	n := (size + ChunkSize - 1) / ChunkSize
	if n <= denseChunks {
		return chunkTable{dense: make([]chunk, n)}
	}
	return chunkTable{segs: make(map[uint64]*[segChunks]chunk)}
}

// get returns chunk i. In a sparse table a chunk whose segment was never
// written is nil unless alloc is set, so reads of holes allocate nothing.
func (t *chunkTable) get(i uint64, alloc bool) *chunk {
	if t.segs == nil {
		return &t.dense[i]
	}
	t.mu.RLock()
	seg := t.segs[i/segChunks]
	t.mu.RUnlock()
	if seg == nil {
		if !alloc {
			return nil
		}
		t.mu.Lock()
		if seg = t.segs[i/segChunks]; seg == nil {
			seg = new([segChunks]chunk)
			t.segs[i/segChunks] = seg
		}
		t.mu.Unlock()
	}
	return &seg[i%segChunks]
}

// each calls fn on every chunk slot that exists, in no particular order
// for sparse tables.
func (t *chunkTable) each(fn func(i uint64, c *chunk)) {
	if t.segs == nil {
		for i := range t.dense {
			fn(uint64(i), &t.dense[i])
		}
		return
	}
	t.mu.RLock()
	segs := make(map[uint64]*[segChunks]chunk, len(t.segs))
	for k, v := range t.segs {
		segs[k] = v
	}
	t.mu.RUnlock()
	for k, seg := range segs {
		for j := range seg {
			fn(k*segChunks+uint64(j), &seg[j])
		}
	}
}

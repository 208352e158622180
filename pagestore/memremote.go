package pagestore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// MemRemote is an in-memory Remote: the reference implementation for tests
// and the "local" system of the benchmarks. Faults wraps it (or any
// Remote) to inject failures and delays.
type MemRemote struct {
	mu    sync.RWMutex
	pages map[pageid.Key][]byte

	// Reads and Writes count pages moved.
	Reads, Writes atomic.Uint64
}

// NewMemRemote returns an empty MemRemote; missing pages read as zeroes.
func NewMemRemote() *MemRemote { return &MemRemote{pages: make(map[pageid.Key][]byte)} }

// ReadPage implements Remote.
func (m *MemRemote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	m.Reads.Add(1)
	m.mu.RLock()
	p, ok := m.pages[k]
	if ok {
		copy(dst, p)
	}
	m.mu.RUnlock()
	if !ok {
		clear(dst)
	}
	return nil
}

// ReadPages implements PagesReader.
func (m *MemRemote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	for i := 0; i < len(p)/pageid.Size; i++ {
		k := pageid.MakeKey(first.Volume(), first.Page()+uint64(i))
		if err := m.ReadPage(ctx, k, p[i*pageid.Size:(i+1)*pageid.Size]); err != nil {
			return err
		}
	}
	return nil
}

// WritePages implements Remote.
func (m *MemRemote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	m.Writes.Add(uint64(len(keys)))
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		p, ok := m.pages[k]
		if !ok {
			p = make([]byte, pageid.Size)
			m.pages[k] = p
		}
		copy(p, pages[i])
	}
	return nil
}

// Page returns a copy of page k as the remote holds it.
func (m *MemRemote) Page(k pageid.Key) []byte {
	out := make([]byte, pageid.Size)
	m.mu.RLock()
	copy(out, m.pages[k])
	m.mu.RUnlock()
	return out
}

// Map implements Mapper a page at a time: a page never written, or
// trimmed, is a hole.
func (m *MemRemote) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	runs := pageid.Runs{Emit: fn}
	for at, end := off, off+n; at < end; {
		next := min(end, (at/pageid.Size+1)*pageid.Size)
		_, held := m.pages[pageid.MakeKey(vol, at/pageid.Size)]
		runs.Add(at, next-at, !held)
		at = next
	}
	runs.Flush()
	return nil
}

// Trim implements Trimmer.
func (m *MemRemote) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	first, end := off/pageid.Size, (off+n)/pageid.Size
	if end-first > uint64(len(m.pages)) { // a file's volume past its size
		for k := range m.pages {
			if k.Volume() == vol && k.Page() >= first && k.Page() < end {
				delete(m.pages, k)
			}
		}
		return nil
	}
	for p := first; p < end; p++ {
		delete(m.pages, pageid.MakeKey(vol, p))
	}
	return nil
}

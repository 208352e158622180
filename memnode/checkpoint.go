package memnode

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// Checkpoints of the persistent store: dirty chunks to the page files,
// the position they cover recorded, older log segments deleted; and the
// store's durability calls (Durable, Close).

// Checkpoint writes dirty chunks to the page files, syncs them, records the
// log position they cover and deletes older log segments.
func (s *Store) Checkpoint() error {
	p := s.persist
	if p == nil {
		return nil
	}
	p.cpMu.Lock()
	defer p.cpMu.Unlock()
	return s.checkpointLocked()
}

func (s *Store) checkpointLocked() error {
	p := s.persist
	// Everything appended so far is reflected in memory (mutations apply
	// before they log), so the position taken now is covered by what the
	// chunks hold from here on. Later entries replay idempotently.
	// The table is taken at the same position: table changes log under
	// s.mu, so none falls between the two.
	s.mu.Lock()
	gen, seq, err := p.log.roll()
	if err != nil {
		s.mu.Unlock()
		return err
	}
	cp := checkpoint{Gen: gen, Offset: 0, Seq: seq, Volumes: s.recordsLocked()}
	vols := make([]*volume, 0, len(s.byID))
	for _, v := range s.byID {
		vols = append(vols, v)
	}
	s.mu.Unlock()
	// A page file holds no more than the size its table record says: a
	// volume grown after the roll has its new bytes in the log, which
	// replays the RESIZE before them; written here, they would be past
	// the end of the volume that loads.
	sizes := make(map[uint16]uint64, len(cp.Volumes))
	for _, r := range cp.Volumes {
		sizes[r.ID] = r.Size
	}
	if p.afterTable != nil {
		p.afterTable()
	}
	buf := make([]byte, ChunkSize)
	for _, v := range vols {
		dirty := false
		v.chunks.each(func(_ uint64, c *chunk) { dirty = dirty || c.dirty.Load() })
		if !dirty {
			continue // no open, no fdatasync for volumes nothing changed
		}
		f, err := p.pageFile(v.info.ID)
		if err != nil {
			return err
		}
		size := int64(sizes[v.info.ID])
		v.chunks.each(func(i uint64, c *chunk) {
			at := int64(i) * ChunkSize
			if err != nil || at >= size || !c.dirty.Swap(false) {
				return
			}
			c.mu.RLock()
			present := c.data != nil
			if present {
				copy(buf, c.data)
			}
			c.mu.RUnlock()
			if present {
				n := min(int64(ChunkSize), size-at)
				_, err = f.WriteAt(buf[:n], at)
			} else {
				err = f.PunchHole(at, ChunkSize)
			}
			if err != nil || (at+ChunkSize > size && int64(v.size.Load()) > size) {
				// Failed, or the chunk goes on past the recorded end of a
				// volume grown meanwhile: the next checkpoint writes it.
				c.dirty.Store(true)
			}
			if err != nil {
				err = fmt.Errorf("memnode: checkpoint of volume %d: %w", v.info.ID, err)
			}
		})
		if err == nil {
			err = f.Datasync()
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("memnode: checkpoint: %w", err)
		}
	}
	b, _ := json.Marshal(cp)
	if err := writeFileAtomic(p.disk, filepath.Join(p.dir, "checkpoint"), b); err != nil {
		return fmt.Errorf("memnode: checkpoint: %w", err)
	}
	p.disk.Remove(filepath.Join(p.dir, "volumes.json")) // the older layout's table: superseded
	names, err := p.disk.Names(p.dir)
	if err != nil {
		return fmt.Errorf("memnode: checkpoint: %w", err)
	}
	var size int64
	for _, g := range segments(names) {
		if g < cp.Gen {
			p.disk.Remove(segPath(p.dir, g))
		} else if fi, err := p.disk.Stat(segPath(p.dir, g)); err == nil {
			size += fi.Size()
		}
	}
	p.log.mu.Lock()
	p.log.size = size + int64(len(p.log.pending))
	p.log.mu.Unlock()
	return nil
}

// maybeCheckpoint keeps the log bounded: past its limit a checkpoint runs
// in the background (one at a time).
func (s *Store) maybeCheckpoint() {
	p := s.persist
	p.log.mu.Lock()
	big := p.log.size > p.log.limit
	p.log.mu.Unlock()
	if big && p.cpMu.TryLock() {
		go func() {
			defer p.cpMu.Unlock()
			s.checkpointLocked()
		}()
	}
}

// SetLogLimit changes the log size that triggers a checkpoint (tests).
func (s *Store) SetLogLimit(n int64) {
	if s.persist != nil {
		s.persist.log.mu.Lock()
		s.persist.log.limit = n
		s.persist.log.mu.Unlock()
	}
}

// Close checkpoints and closes a persistent store (no-op otherwise).
func (s *Store) Close() error {
	if s.persist == nil {
		return nil
	}
	err := s.Checkpoint()
	s.persist.log.close()
	return err
}

// Durable waits until the mutation with durability token seq (returned by
// the store's internal write paths; 0 = none) is on stable storage.
func (s *Store) Durable(seq uint64) error {
	if s.persist == nil {
		return nil
	}
	return s.persist.log.waitDurable(seq)
}

// LogStats reports syncs and entries (group-commit batch = entries/syncs).
func (s *Store) LogStats() (syncs, entries uint64) {
	if s.persist == nil {
		return 0, 0
	}
	return s.persist.log.Syncs.Load(), s.persist.log.Entries.Load()
}

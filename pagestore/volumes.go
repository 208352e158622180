package pagestore

import (
	"fmt"
	"sort"

	"github.com/pd3-go/pd3/pageid"
)

// The volumes a store serves: adding and removing them, fencing, and the
// checks every key goes through.

// AddVolume makes the store serve pages of v.
func (s *Store) AddVolume(v pageid.VolumeInfo) {
	s.vmu.Lock()
	s.volumes[v.ID] = v
	delete(s.fenced, v.ID)
	s.vmu.Unlock()
}

// RemoveVolume stops serving volume id and drops its cached pages without
// writing them back, so that the id can be reused by a new volume (the
// memory node recycles ids) without the old pages showing through. The
// caller must have stopped all I/O to the volume.
func (s *Store) RemoveVolume(id uint16) { s.RemoveVolumePages(id, ^uint64(0)) }

// RemoveVolumePages is RemoveVolume for a volume none of whose pages at
// or past page end was ever cached: when end is below the number of
// frames, it looks those pages up instead of scanning every frame (a
// deleted small file costs a few lookups, not a pass over the cache).
func (s *Store) RemoveVolumePages(id uint16, end uint64) {
	s.vmu.Lock()
	delete(s.volumes, id)
	s.vmu.Unlock()
	s.discardPages(id, 0, end, false)
	s.invalidate(id, 0, ^uint64(0))
}

// discardPages drops the cached pages first to end (exclusive) of volume
// id without writing them back (with cleanOnly, the clean ones). A range
// of fewer pages than the cache has frames is looked up page by page; a
// longer one (a file's volume is terabytes) costs one pass over the
// frames instead.
func (s *Store) discardPages(id uint16, first, end uint64, cleanOnly bool) {
	if end-first < uint64(len(s.frames)) {
		for p := first; p < end; p++ {
			s.drop(pageid.MakeKey(id, p), cleanOnly)
		}
		return
	}
	for f := range s.frames {
		fr := &s.frames[f]
		fr.mu.RLock()
		k, valid := fr.key, fr.valid
		fr.mu.RUnlock()
		if valid && k.Volume() == id && k.Page() >= first && k.Page() < end {
			s.drop(k, cleanOnly)
		}
	}
}

// FenceVolume stops serving volume id because another host took it over:
// its cached pages, dirty ones included, are dropped unwritten (writing
// them back would overwrite the new owner's data) and every later request
// for it fails with pageid.ErrFenced.
func (s *Store) FenceVolume(id uint16) {
	s.vmu.Lock()
	if s.fenced == nil {
		s.fenced = map[uint16]bool{}
	}
	s.fenced[id] = true
	s.vmu.Unlock()
	s.RemoveVolume(id)
}

// Fenced reports whether FenceVolume took volume id away.
func (s *Store) Fenced(id uint16) bool {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	return s.fenced[id]
}

// missing is the error for a volume not in s.volumes.
func (s *Store) missing(id uint16) error {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	if s.fenced[id] {
		return pageid.ErrFenced
	}
	return pageid.ErrNoVolume
}

// Volumes returns the served volumes ordered by id.
func (s *Store) Volumes() []pageid.VolumeInfo {
	s.vmu.RLock()
	out := make([]pageid.VolumeInfo, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v)
	}
	s.vmu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Pages returns the number of pages of volume id, 0 if it is not served.
func (s *Store) Pages(id uint16) uint64 {
	s.vmu.RLock()
	v, ok := s.volumes[id]
	s.vmu.RUnlock()
	if !ok {
		return 0
	}
	return v.Size / pageid.Size
}

// Volume returns the volume called name.
func (s *Store) Volume(name string) (pageid.VolumeInfo, bool) {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	for _, v := range s.volumes {
		if v.Name == name {
			return v, true
		}
	}
	return pageid.VolumeInfo{}, false
}

// Suspend holds every new request back (reads and writes, at their
// validation) until Resume: for a host that is no longer sure it still
// holds its volumes (its etcd session ended on its side) and asks. Once it
// knows, it resumes, after FenceVolume if the answer was no, so that what
// was held back fails instead of being served stale. Requests already
// admitted run on.
func (s *Store) Suspend() {
	ch := make(chan struct{})
	s.held.CompareAndSwap(nil, &ch)
}

// Resume lets the requests Suspend held back go on.
func (s *Store) Resume() {
	if ch := s.held.Swap(nil); ch != nil {
		close(*ch)
	}
}

func (s *Store) waitServing() {
	if ch := s.held.Load(); ch != nil {
		<-*ch
	}
}

// CheckKey validates k against the served volumes.
func (s *Store) CheckKey(k pageid.Key) error {
	s.waitServing()
	s.vmu.RLock()
	v, ok := s.volumes[k.Volume()]
	s.vmu.RUnlock()
	if !ok {
		return fmt.Errorf("page %v: %w", k, s.missing(k.Volume()))
	}
	if k.Page() >= v.Size/pageid.Size {
		return fmt.Errorf("page %v of %q (%d pages): %w", k, v.Name, v.Size/pageid.Size, pageid.ErrOutOfRange)
	}
	return nil
}

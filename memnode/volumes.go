package memnode

import (
	"fmt"
	"sort"

	"github.com/pd3-go/pd3/pageid"
)

// A store's volumes: create, resize, open, list and delete (fenced), the
// table the log records, and the bounds every access is checked against.

// Create makes a new volume of size bytes (rounded up to a page).
func (s *Store) Create(name string, size uint64) (pageid.VolumeInfo, error) {
	if err := validName(name); err != nil {
		return pageid.VolumeInfo{}, err
	}
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	if size == 0 || size/pageid.Size >= 1<<pageid.PageBits {
		return pageid.VolumeInfo{}, fmt.Errorf("%w: volume size %d", ErrBadRequest, size)
	}
	if err := s.admit(); err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("creating %q: %w", name, err)
	}
	s.mu.Lock()
	if _, ok := s.byName[name]; ok {
		s.mu.Unlock()
		return pageid.VolumeInfo{}, fmt.Errorf("creating %q: %w", name, pageid.ErrExists)
	}
	id, ok := s.freeID()
	if !ok {
		s.mu.Unlock()
		return pageid.VolumeInfo{}, fmt.Errorf("creating %q: %w: all volume ids in use", name, pageid.ErrNoMemory)
	}
	v := newVolume(pageid.VolumeInfo{ID: id, Size: size, Name: name})
	tok, err := s.logTableLocked(opLogCreate, id, size, 0, name)
	if err != nil {
		s.mu.Unlock()
		return pageid.VolumeInfo{}, err
	}
	s.byName[name] = v
	s.byID[id] = v
	s.mu.Unlock()
	// Like a write, the new volume is visible before it is durable; what
	// is written to it is logged after it, so never durable before it.
	if err := s.Durable(tok); err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("creating %q: %w", name, err)
	}
	return v.current(), nil
}

// logTableLocked appends a change of the volume table to the log (s.mu
// held, so the log orders table changes as the table does) and returns
// the durability token to wait for after unlocking. A journal entry costs
// a share of one group-committed fdatasync, where rewriting the whole
// table cost an fsync of a file and of the directory per change (a
// persistent node under a filesystem's creates and deletes spent most of
// its time there).
func (s *Store) logTableLocked(op byte, id uint16, off, count uint64, name string) (uint64, error) {
	if s.persist == nil || s.persist.log == nil {
		return 0, nil
	}
	tok, err := s.persist.log.append(op, id, off, count, []byte(name))
	if err != nil {
		return 0, fmt.Errorf("memnode: recording the volume table: %w", err)
	}
	return tok, nil
}

// records is the volume table as the checkpoint saves it; s.mu held.
func (s *Store) recordsLocked() []volumeRecord {
	vs := make([]volumeRecord, 0, len(s.byID))
	for _, v := range s.byID {
		vs = append(vs, volumeRecord{VolumeInfo: v.current(), Fence: v.fence.Load()})
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].ID < vs[j].ID })
	return vs
}

// restoreVolume re-creates a volume read from persistent state.
func (s *Store) restoreVolume(rec volumeRecord) error {
	info := rec.VolumeInfo
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[info.ID]; ok || info.ID == 0 || validName(info.Name) != nil {
		return fmt.Errorf("%w: volume table entry %+v", pageid.ErrCorrupt, info)
	}
	v := newVolume(info)
	v.fence.Store(rec.Fence)
	s.byName[info.Name] = v
	s.byID[info.ID] = v
	if info.ID >= s.nextID {
		s.nextID = info.ID + 1
	}
	return nil
}

// freeID finds an unused volume id; ids are never 0. Called with mu held.
func (s *Store) freeID() (uint16, bool) {
	for i := 0; i < 1<<16; i++ {
		id := s.nextID
		s.nextID++
		if s.nextID == 0 {
			s.nextID = 1
		}
		if _, used := s.byID[id]; !used && id != 0 {
			return id, true
		}
	}
	return 0, false
}

func validName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: volume name length %d", ErrBadRequest, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e || c == '/' {
			return fmt.Errorf("%w: volume name %q has byte %#x", ErrBadRequest, name, c)
		}
	}
	return nil
}

// Resize grows volume name to size bytes (rounded up to a page); the new
// bytes read as zeroes. Shrinking is refused: it would drop data a host
// may still hold in its cache, and no client of a volume learns of it.
// A size equal to the current one changes nothing.
func (s *Store) Resize(name string, size uint64) (pageid.VolumeInfo, error) {
	size = (size + pageid.Size - 1) &^ (pageid.Size - 1)
	if size == 0 || size/pageid.Size >= 1<<pageid.PageBits {
		return pageid.VolumeInfo{}, fmt.Errorf("%w: volume size %d", ErrBadRequest, size)
	}
	if err := s.admit(); err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("resizing %q: %w", name, err)
	}
	s.mu.Lock()
	v, ok := s.byName[name]
	if !ok {
		s.mu.Unlock()
		return pageid.VolumeInfo{}, fmt.Errorf("resizing %q: %w", name, pageid.ErrNoVolume)
	}
	cur := v.size.Load()
	if size < cur {
		s.mu.Unlock()
		return pageid.VolumeInfo{}, fmt.Errorf("resizing %q: %w: %d bytes is smaller than its %d (volumes only grow)", name, ErrBadRequest, size, cur)
	}
	var tok uint64
	if size > cur {
		var err error
		if tok, err = s.logTableLocked(opLogResize, v.info.ID, size, 0, name); err != nil {
			s.mu.Unlock()
			return pageid.VolumeInfo{}, err
		}
		v.grow(size)
	}
	s.mu.Unlock()
	if err := s.Durable(tok); err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("resizing %q: %w", name, err)
	}
	return v.current(), nil
}

// Open returns the volume called name.
func (s *Store) Open(name string) (pageid.VolumeInfo, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.byName[name]
	if !ok {
		return pageid.VolumeInfo{}, fmt.Errorf("opening %q: %w", name, pageid.ErrNoVolume)
	}
	return v.current(), nil
}

// List returns all volumes ordered by id.
func (s *Store) List() []pageid.VolumeInfo {
	s.mu.RLock()
	out := make([]pageid.VolumeInfo, 0, len(s.byID))
	for _, v := range s.byID {
		out = append(out, v.current())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Delete removes a volume and frees its memory.
func (s *Store) Delete(name string) error { return s.DeleteFenced(name, 0) }

// DeleteFenced removes a volume unless token is older than the newest
// fencing token presented for it (pageid.ErrFenced): a holder superseded while
// its DELETE was on the way cannot free the volume of the one that
// replaced it. Token 0 is an operator's delete, which the control plane
// allows only for volumes no host holds.
func (s *Store) DeleteFenced(name string, token uint64) error {
	if s.persist != nil {
		// Wait out any checkpoint: it may be writing this volume's page
		// file, which must be gone before the volume's id is reused.
		s.persist.cpMu.Lock()
		defer s.persist.cpMu.Unlock()
	}
	s.mu.Lock()
	v, ok := s.byName[name]
	var tok uint64
	if ok && token != 0 && token < v.fence.Load() {
		s.mu.Unlock()
		return fmt.Errorf("deleting %q with token %d: %w", name, token, pageid.ErrFenced)
	}
	if ok {
		var err error
		if tok, err = s.logTableLocked(opLogDelete, v.info.ID, 0, 0, name); err != nil {
			s.mu.Unlock()
			return err
		}
		delete(s.byName, name)
		delete(s.byID, v.info.ID)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("deleting %q: %w", name, pageid.ErrNoVolume)
	}
	if err := s.Durable(tok); err != nil {
		return fmt.Errorf("deleting %q: %w", name, err)
	}
	s.dropVolume(v)
	return nil
}

// dropVolume frees a volume taken out of the table: its page file, its
// chunks.
func (s *Store) dropVolume(v *volume) {
	if s.persist != nil {
		s.persist.disk.Remove(s.persist.pagePath(v.info.ID))
	}
	v.deleted.Store(true)
	v.chunks.each(func(_ uint64, c *chunk) { s.freeChunk(c) })
}

func (s *Store) volume(id uint16) (*volume, error) {
	s.mu.RLock()
	v, ok := s.byID[id]
	s.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("volume %d: %w", id, pageid.ErrNoVolume)
	}
	return v, nil
}

func newVolume(info pageid.VolumeInfo) *volume {
	v := &volume{info: info, chunks: newChunkTable(info.Size)}
	v.size.Store(info.Size)
	return v
}

// grow makes the volume size bytes long, if that is longer: the table
// first, then the size requests check against.
func (v *volume) grow(size uint64) {
	if size > v.size.Load() {
		v.chunks.grow(size)
		v.size.Store(size)
	}
}

func (v *volume) check(off, n uint64) error {
	if n > MaxIO {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	return v.checkRange(off, n)
}

func (v *volume) checkRange(off, n uint64) error {
	if size := v.size.Load(); off > size || n > size-off {
		return fmt.Errorf("%w: %d+%d past volume %q of %d bytes", pageid.ErrOutOfRange, off, n, v.info.Name, size)
	}
	return nil
}

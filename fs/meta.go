package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// Inode numbers. Regular files, directories and symlinks get numbers from
// nextIno, never reused; the volumes directory and its files are
// synthetic and live above volumeInoBase.
const (
	rootIno       = 1
	volumesIno    = 2
	firstIno      = 16
	volumeInoBase = 1 << 62
	volumesName   = "volumes"
)

// MaxFileSize is the size of a file's data volume at the memory node: a
// sparse 4 TiB, of which only written chunks use memory.
const MaxFileSize = 4 << 40

// metaIO is the most the metadata's reads and writes move in one request:
// a memory node's largest (memnode.MaxIO; fs's tests check they agree).
const metaIO = 1 << 20

// maxName is NAME_MAX.
const maxName = 255

// attrs is what the metadata keeps of an inode besides a directory's
// entries. A journal record carries it whole; fields are exported for
// JSON, and the model's lock guards them.
type attrs struct {
	Ino   uint64
	Mode  uint32 // type and permission bits
	UID   uint32
	GID   uint32
	Nlink uint32
	Size  uint64
	Atime int64 // ns since the epoch
	Mtime int64
	Ctime int64
	// Parent is a directory's parent (for the rename-into-itself check);
	// files may have several and do not record them.
	Parent uint64
	Target string            // symlink
	Rdev   uint32            `json:",omitempty"` // character or block device: its number
	Xattr  map[string][]byte `json:",omitempty"`
	Vol    string            `json:",omitempty"` // regular file: its data volume's name
	// Data is the bytes of a regular file without a volume: a file
	// created holds them here (len(Data) == Size) until a write or
	// truncation takes it past inlineMax (see inline.go).
	Data []byte `json:",omitempty"`
}

// inode is the state of a file, directory or symlink. The embedded attrs
// and Entries are persistent (a snapshot holds them as one JSON object);
// the rest lives for this run.
type inode struct {
	attrs
	Entries map[string]uint64 // directory
	// listVer counts changes of Entries in this run (dirListing).
	listVer uint64

	vol   uint16 // the data volume's id in this run
	opens int    // open handles; an unlinked file is freed at the last close
	// followed: its page cache is followed (follow.go), under FS.mu.
	followed bool
	// peak is the furthest any write of this run reached, whether it
	// succeeded or not (a failed write may leave pages cached past Size;
	// truncation drops the pages past the new size itself): no page at
	// or past max(Size, peak) is cached, so freeing the file looks up
	// that many pages (pagestore.RemoveVolumePages) instead of scanning
	// the cache.
	peak atomic.Uint64
	// io orders data writes (shared) against truncation (exclusive); it
	// is not guarded by the model's lock.
	io sync.RWMutex
	// stale is 1 + the first byte from which what lies past the size
	// may not be zeroes (0: nothing stale): the size the file had when
	// it was loaded after a mount that crashed, or where a write that
	// failed past the size began. Those bytes are zeroed before anything
	// makes them part of the file (stale.go).
	stale atomic.Uint64
	// gen is bumped by every change of the file's bytes (write,
	// truncation, fallocate, its move to a volume) before the change
	// returns; streams are its open handles' read-ahead (readahead.go),
	// whose windows count only if gen did not move while they were read.
	gen     atomic.Uint64
	streams streamSet
	// shownStored is 1 + the bytes stored that the attributes last
	// given to the kernel counted in st_blocks (0: none given): an fsync
	// that stores no more drops nothing the kernel holds.
	shownStored atomic.Uint64
}

func (n *inode) isDir() bool     { return n.Mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n *inode) isReg() bool     { return n.Mode&syscall.S_IFMT == syscall.S_IFREG }
func (n *inode) touch(now int64) { n.Mtime, n.Ctime = now, now }

// written is how far the file's bytes may reach, in whole pages: its
// size or the furthest any write of this run reached. The model's lock
// must be held (Size).
func (n *inode) written() uint64 {
	return pageUp(max(n.Size, n.peak.Load()))
}

// reach records that the file's pages below size may be cached. It
// returns how far writes of this run reached before it (atomically: of
// writers that reach past the same page, only the first sees it unreached).
func (n *inode) reach(size uint64) (before uint64) {
	for {
		p := n.peak.Load()
		if p >= size || n.peak.CompareAndSwap(p, size) {
			return p
		}
	}
}

// snapshot is the whole tree, as a slot of the metadata volume holds it.
type snapshot struct {
	Version int
	NextIno uint64
	Inodes  []*inode
}

// snapshotVersion is what this version writes: 3, a snapshot that may
// be followed by journal records and hold small files' bytes (Data). An
// older pd3, which reads version 2 only, refuses it rather than mount
// the tree without its journal. Version 2 (JSON, no journal; 1 was gob)
// is still read.
const (
	snapshotVersion   = 3
	oldestSnapshotVer = 2
)

// record is one journal record: what changed since the record before it
// (or the snapshot), as the state it changed to, so that replaying a
// record twice, or one whose change a snapshot already holds, changes
// nothing. Its size follows the change, not the tree: a directory's
// entries travel one name at a time.
type record struct {
	NextIno uint64
	// Inodes are new or changed inodes, whole but for a directory's
	// entries.
	Inodes []attrs `json:",omitempty"`
	// Entries are directory entries as they now are: Ino 0 means the
	// name is gone.
	Entries []dentry `json:",omitempty"`
	// Freed are inodes that no longer exist (no names, or no names left
	// and only open handles, which a crash closes).
	Freed []uint64 `json:",omitempty"`
}

// dentry is a directory entry: name in directory Dir names inode Ino.
type dentry struct {
	Dir  uint64
	Name string
	Ino  uint64
}

// Metadata volume layout. A header page at 0 names the slot that holds
// the newest snapshot, with its generation, length and CRC. A snapshot is
// written to the other slot and acknowledged before the header moves to
// it, so a crash mid-write leaves the previous snapshot and its journal
// intact; the header is one page, which the memory node writes atomically.
//
// The journal of a snapshot follows it in its slot, from the first page
// boundary after it: records back to back, each
//
//	off  size  field
//	0    4     magic "PD3J"
//	4    4     CRC-32C of bytes 8 to the payload's end
//	8    8     generation: the header's when the record was written
//	16   4     sequence number: 0, 1, ... after the snapshot
//	20   4     payload length
//	24   n     payload: a record in JSON
//
// A record is appended only after the one before it is acknowledged, so
// only the last can be torn; loading replays records until the first
// whose magic, generation, sequence or checksum is wrong (a torn tail, or
// an older generation's records in a reused slot). Once the journal
// outgrows twice its snapshot (and compactMin), the syncer folds it into
// a new snapshot: writing snapshots then costs at most half of what the
// journal did, so a change costs O(its size).
const (
	metaMagic    = "PD3FSMD1"
	metaSlot0    = 1 << 20
	metaSlotSize = 1 << 30
	metaVolSize  = metaSlot0 + 2*metaSlotSize

	journalMagic  = "PD3J"
	journalHeader = 24
	compactMin    = 4 << 20
)

// errJournalFull means a record does not fit in the slot: the caller
// writes a snapshot instead.
var errJournalFull = errors.New("fs: the metadata journal is full")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaStore reads and writes snapshots and journal records in the
// metadata volume.
type metaStore struct {
	c   Backend
	vol uint16

	mu   sync.Mutex // one write at a time
	gen  uint64
	slot int
	n    uint64 // bytes of the snapshot in slot
	jlen uint64 // bytes of its journal
	seq  uint32 // the next record's sequence number
}

func slotOff(slot int) uint64 { return uint64(metaSlot0 + slot*metaSlotSize) }

func pageUp(n uint64) uint64 { return (n + pageid.Size - 1) &^ (pageid.Size - 1) }

// load returns the newest snapshot with its journal replayed, or nil for
// a fresh volume.
func (m *metaStore) load(ctx context.Context) (*snapshot, error) {
	hdr := make([]byte, pageid.Size)
	if err := m.c.ReadAt(ctx, m.vol, 0, hdr); err != nil {
		return nil, fmt.Errorf("fs: reading the metadata header: %w", err)
	}
	if bytes.Equal(hdr[:8], make([]byte, 8)) {
		return nil, nil
	}
	if string(hdr[:8]) != metaMagic {
		return nil, fmt.Errorf("fs: metadata header: %w: bad magic %q", pageid.ErrCorrupt, hdr[:8])
	}
	gen := binary.LittleEndian.Uint64(hdr[8:])
	slot := int(binary.LittleEndian.Uint32(hdr[16:]))
	n := binary.LittleEndian.Uint64(hdr[24:])
	sum := binary.LittleEndian.Uint32(hdr[32:])
	if slot > 1 || n > metaSlotSize {
		return nil, fmt.Errorf("fs: metadata header: %w: slot %d, %d bytes", pageid.ErrCorrupt, slot, n)
	}
	buf := make([]byte, n)
	if err := m.read(ctx, slotOff(slot), buf); err != nil {
		return nil, fmt.Errorf("fs: reading metadata: %w", err)
	}
	if crc32.Checksum(buf, castagnoli) != sum {
		return nil, fmt.Errorf("fs: metadata generation %d: %w: checksum mismatch", gen, pageid.ErrCorrupt)
	}
	s, err := decodeSnapshot(buf)
	if err != nil {
		return nil, fmt.Errorf("fs: metadata generation %d: %w", gen, err)
	}
	j := journalReader{m: m, ctx: ctx, at: slotOff(slot) + pageUp(n), end: slotOff(slot) + metaSlotSize}
	recs, jlen, err := j.records(gen)
	if err != nil {
		return nil, fmt.Errorf("fs: reading the metadata journal: %w", err)
	}
	if err := replay(s, recs); err != nil {
		return nil, fmt.Errorf("fs: metadata generation %d, journal: %w", gen, err)
	}
	m.gen, m.slot, m.n, m.jlen, m.seq = gen, slot, n, jlen, uint32(len(recs))
	return s, nil
}

// The clean mark is one word of the metadata volume, on a page of its
// own: Close writes cleanMark there once everything is saved, and Open
// clears it. A mount that finds no mark follows one that crashed, whose
// write-backs may have reached past the sizes it saved (stale tails).
const (
	cleanOff  = 2 * pageid.Size
	cleanMark = 0x4e41454c43334450 // "PD3CLEAN", little-endian
)

// takeClean reports whether the previous mount ended with Close, and
// clears the mark so that the next mount learns whether this one did.
func (m *metaStore) takeClean(ctx context.Context) (bool, error) {
	var w [8]byte
	if err := m.read(ctx, cleanOff, w[:]); err != nil {
		return false, fmt.Errorf("fs: reading the clean mark: %w", err)
	}
	if binary.LittleEndian.Uint64(w[:]) != cleanMark {
		return false, nil
	}
	if err := m.write(ctx, cleanOff, make([]byte, 8)); err != nil {
		return false, fmt.Errorf("fs: clearing the clean mark: %w", err)
	}
	return true, nil
}

// markClean records that this mount saved everything and stops.
func (m *metaStore) markClean(ctx context.Context) error {
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], cleanMark)
	if err := m.write(ctx, cleanOff, w[:]); err != nil {
		return fmt.Errorf("fs: writing the clean mark: %w", err)
	}
	return nil
}

// read fills p from off of the metadata volume, a chunk per request.
func (m *metaStore) read(ctx context.Context, off uint64, p []byte) error {
	for at := 0; at < len(p); at += metaIO {
		if err := m.c.ReadAt(ctx, m.vol, off+uint64(at), p[at:min(len(p), at+metaIO)]); err != nil {
			return err
		}
	}
	return nil
}

// write writes p at off of the metadata volume, its chunks at once: one
// round trip, not one per MiB.
func (m *metaStore) write(ctx context.Context, off uint64, p []byte) error {
	if len(p) <= metaIO {
		return m.c.WriteAt(ctx, m.vol, off, p)
	}
	errs := make([]error, (len(p)+metaIO-1)/metaIO)
	var wg sync.WaitGroup
	for i := range errs {
		at := i * metaIO
		wg.Go(func() {
			errs[i] = m.c.WriteAt(ctx, m.vol, off+uint64(at), p[at:min(len(p), at+metaIO)])
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// journalReader reads a slot's journal a chunk at a time, so that loading
// reads what the journal holds, not the slot.
type journalReader struct {
	m       *metaStore
	ctx     context.Context
	at, end uint64 // the journal's start and the slot's end in the volume
	buf     []byte // the journal's bytes read so far
}

// fill makes buf hold at least n bytes, or reports that the slot ends
// first.
func (j *journalReader) fill(n uint64) (bool, error) {
	if n > j.end-j.at {
		return false, nil
	}
	for uint64(len(j.buf)) < n {
		have := uint64(len(j.buf))
		more := min(uint64(metaIO), j.end-j.at-have)
		j.buf = append(j.buf, make([]byte, more)...)
		if err := j.m.c.ReadAt(j.ctx, j.m.vol, j.at+have, j.buf[have:]); err != nil {
			return false, err
		}
	}
	return true, nil
}

// records returns the payloads of generation gen's records in order and
// the bytes they take, stopping at the first that is not one of them.
func (j *journalReader) records(gen uint64) ([][]byte, uint64, error) {
	var recs [][]byte
	var pos uint64
	for {
		ok, err := j.fill(pos + journalHeader)
		if err != nil || !ok {
			return recs, pos, err
		}
		h := j.buf[pos : pos+journalHeader]
		size := uint64(binary.LittleEndian.Uint32(h[20:]))
		if string(h[:4]) != journalMagic || binary.LittleEndian.Uint64(h[8:]) != gen ||
			binary.LittleEndian.Uint32(h[16:]) != uint32(len(recs)) {
			return recs, pos, nil
		}
		if ok, err = j.fill(pos + journalHeader + size); err != nil || !ok {
			return recs, pos, err
		}
		e := j.buf[pos : pos+journalHeader+size]
		if crc32.Checksum(e[8:], castagnoli) != binary.LittleEndian.Uint32(e[4:]) {
			return recs, pos, nil
		}
		recs = append(recs, e[journalHeader:])
		pos += journalHeader + size
	}
}

// appendRecord appends an encoded record to the newest snapshot's
// journal; errJournalFull if the slot has no room for it.
func (m *metaStore) appendRecord(ctx context.Context, payload []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	start := pageUp(m.n) + m.jlen
	size := uint64(journalHeader + len(payload))
	if start+size > metaSlotSize {
		return errJournalFull
	}
	e := make([]byte, size)
	copy(e, journalMagic)
	binary.LittleEndian.PutUint64(e[8:], m.gen)
	binary.LittleEndian.PutUint32(e[16:], m.seq)
	binary.LittleEndian.PutUint32(e[20:], uint32(len(payload)))
	copy(e[journalHeader:], payload)
	binary.LittleEndian.PutUint32(e[4:], crc32.Checksum(e[8:], castagnoli))
	if err := m.write(ctx, slotOff(m.slot)+start, e); err != nil {
		return fmt.Errorf("fs: appending to the metadata journal: %w", err)
	}
	m.jlen += size
	m.seq++
	return nil
}

// compactDue reports whether the journal has outgrown its snapshot.
func (m *metaStore) compactDue() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.jlen >= max(compactMin, 2*m.n)
}

// written calls each with the ranges of the metadata volume that hold
// the header and the newest snapshot with its journal.
func (m *metaStore) written(each func(off, n uint64)) {
	m.mu.Lock()
	slot, n := m.slot, pageUp(m.n)+m.jlen
	m.mu.Unlock()
	each(0, pageid.Size)
	each(slotOff(slot), n)
}

// decodeSnapshot decodes and checks a snapshot.
func decodeSnapshot(b []byte) (*snapshot, error) {
	var s snapshot
	// JSON, not gob: gob trusts the lengths it reads and a damaged
	// snapshot could make it allocate gigabytes (FuzzSnapshot found one);
	// JSON allocates in proportion to its input.
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", pageid.ErrCorrupt, err)
	}
	if s.Version < oldestSnapshotVer || s.Version > snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, this pd3 reads %d to %d", pageid.ErrCorrupt, s.Version, oldestSnapshotVer, snapshotVersion)
	}
	byIno := make(map[uint64]*inode, len(s.Inodes))
	for _, n := range s.Inodes {
		if n == nil || byIno[n.Ino] != nil {
			return nil, fmt.Errorf("%w: bad or repeated inode", pageid.ErrCorrupt)
		}
		byIno[n.Ino] = n
	}
	if err := check(byIno, s.NextIno); err != nil {
		return nil, err
	}
	return &s, nil
}

// check checks a tree: sound inode numbers, a root directory, every entry
// naming an inode, every directory's parent a directory reaching the
// root. The model relies on all of it (rename walks parents).
func check(byIno map[uint64]*inode, nextIno uint64) error {
	for _, n := range byIno {
		if n.Ino == 0 || n.Ino >= volumeInoBase || (n.Ino >= nextIno && n.Ino != rootIno) {
			return fmt.Errorf("%w: bad inode number %d", pageid.ErrCorrupt, n.Ino)
		}
		if len(n.Data) > 0 && !n.inline() || n.inline() && (n.Size > inlineMax || uint64(len(n.Data)) != n.Size) {
			return fmt.Errorf("%w: file %d: %d bytes in the inode, size %d, volume %q", pageid.ErrCorrupt, n.Ino, len(n.Data), n.Size, n.Vol)
		}
	}
	if r := byIno[rootIno]; r == nil || !r.isDir() {
		return fmt.Errorf("%w: no root directory", pageid.ErrCorrupt)
	}
	for _, n := range byIno {
		for name, ino := range n.Entries {
			c := byIno[ino]
			if !n.isDir() || c == nil || checkName(name) != 0 || ino == rootIno || (c.isDir() && c.Parent != n.Ino) {
				return fmt.Errorf("%w: directory %d entry %q", pageid.ErrCorrupt, n.Ino, name)
			}
		}
		if !n.isDir() {
			continue
		}
		p, steps := n, 0
		for p.Ino != rootIno {
			if p = byIno[p.Parent]; p == nil || !p.isDir() || steps > len(byIno) {
				return fmt.Errorf("%w: directory %d does not reach the root", pageid.ErrCorrupt, n.Ino)
			}
			steps++
		}
	}
	return nil
}

// replay applies journal records to s in order and checks the tree they
// make. A record that passed its checksum but does not apply means the
// journal is damaged beyond a torn tail: an error, not a guess.
func replay(s *snapshot, recs [][]byte) error {
	if len(recs) == 0 {
		return nil
	}
	byIno := make(map[uint64]*inode, len(s.Inodes))
	for _, n := range s.Inodes {
		byIno[n.Ino] = n
	}
	for i, b := range recs {
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("record %d: %w: %v", i, pageid.ErrCorrupt, err)
		}
		if err := r.apply(byIno); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		s.NextIno = max(s.NextIno, r.NextIno)
	}
	if err := check(byIno, s.NextIno); err != nil {
		return err
	}
	s.Inodes = s.Inodes[:0]
	for _, n := range byIno {
		s.Inodes = append(s.Inodes, n)
	}
	return nil
}

// apply changes the tree byIno as r says.
func (r *record) apply(byIno map[uint64]*inode) error {
	for _, a := range r.Inodes {
		n := byIno[a.Ino]
		if n == nil {
			n = &inode{}
			byIno[a.Ino] = n
		}
		n.attrs = a
		if n.isDir() && n.Entries == nil {
			n.Entries = map[string]uint64{}
		}
	}
	for _, e := range r.Entries {
		d := byIno[e.Dir]
		if d == nil || !d.isDir() {
			return fmt.Errorf("%w: entry %q of %d, which is no directory", pageid.ErrCorrupt, e.Name, e.Dir)
		}
		if e.Ino == 0 {
			delete(d.Entries, e.Name)
		} else {
			d.Entries[e.Name] = e.Ino
		}
	}
	for _, ino := range r.Freed {
		delete(byIno, ino)
	}
	return nil
}

// save writes an encoded snapshot to the free slot, then flips the
// header; the new snapshot's journal starts empty.
func (m *metaStore) save(ctx context.Context, b []byte) error {
	if len(b) > metaSlotSize {
		return fmt.Errorf("fs: metadata of %d bytes: %w", len(b), syscall.ENOSPC)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	slot := 1 - m.slot
	if err := m.write(ctx, slotOff(slot), b); err != nil {
		return fmt.Errorf("fs: writing metadata: %w", err)
	}
	hdr := make([]byte, pageid.Size)
	copy(hdr, metaMagic)
	binary.LittleEndian.PutUint64(hdr[8:], m.gen+1)
	binary.LittleEndian.PutUint32(hdr[16:], uint32(slot))
	binary.LittleEndian.PutUint64(hdr[24:], uint64(len(b)))
	binary.LittleEndian.PutUint32(hdr[32:], crc32.Checksum(b, castagnoli))
	if err := m.c.WriteAt(ctx, m.vol, 0, hdr); err != nil {
		return fmt.Errorf("fs: writing the metadata header: %w", err)
	}
	m.gen++
	m.slot, m.n, m.jlen, m.seq = slot, uint64(len(b)), 0, 0
	return nil
}

func nowNs() int64 { return time.Now().UnixNano() }

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

	"github.com/pd3-go/pd3/memnode"
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

// maxName is NAME_MAX.
const maxName = 255

// inode is the persistent state of a file, directory or symlink. Fields
// are exported for the JSON snapshot; the model's lock guards them.
type inode struct {
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
	Parent  uint64
	Target  string            // symlink
	Entries map[string]uint64 // directory
	Xattr   map[string][]byte
	Vol     string // regular file: its data volume's name

	vol   uint16 // the data volume's id in this run
	opens int    // open handles; an unlinked file is freed at the last close
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
}

func (n *inode) isDir() bool     { return n.Mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n *inode) isReg() bool     { return n.Mode&syscall.S_IFMT == syscall.S_IFREG }
func (n *inode) touch(now int64) { n.Mtime, n.Ctime = now, now }

// written is how far the file's bytes may reach, in whole pages: its
// size or the furthest any write of this run reached. The model's lock
// must be held (Size).
func (n *inode) written() uint64 {
	return (max(n.Size, n.peak.Load()) + pageid.Size - 1) &^ (pageid.Size - 1)
}

// reach records that the file's pages below size may be cached.
func (n *inode) reach(size uint64) {
	for p := n.peak.Load(); p < size && !n.peak.CompareAndSwap(p, size); p = n.peak.Load() {
	}
}

// snapshot is what the metadata volume holds.
type snapshot struct {
	Version int
	NextIno uint64
	Inodes  []*inode
}

const snapshotVersion = 2 // 2: JSON (1 was gob)

// Metadata volume layout: a header page at 0 names which of two slots holds
// the newest snapshot, with its generation, length and CRC. A snapshot is
// written to the other slot and acknowledged before the header moves to
// it, so a crash mid-write leaves the previous snapshot intact; the header
// is one page, which the memory node writes atomically.
const (
	metaMagic    = "PD3FSMD1"
	metaSlot0    = 1 << 20
	metaSlotSize = 1 << 30
	metaVolSize  = metaSlot0 + 2*metaSlotSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaStore reads and writes snapshots in the metadata volume.
type metaStore struct {
	c   Backend
	vol uint16

	mu   sync.Mutex // one snapshot write at a time
	gen  uint64
	slot int
	n    uint64 // bytes of the snapshot in slot
}

// load returns the newest snapshot, or nil for a fresh volume.
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
	for off := uint64(0); off < n; off += memnode.MaxIO {
		end := min(n, off+memnode.MaxIO)
		if err := m.c.ReadAt(ctx, m.vol, uint64(metaSlot0+slot*metaSlotSize)+off, buf[off:end]); err != nil {
			return nil, fmt.Errorf("fs: reading metadata: %w", err)
		}
	}
	if crc32.Checksum(buf, castagnoli) != sum {
		return nil, fmt.Errorf("fs: metadata generation %d: %w: checksum mismatch", gen, pageid.ErrCorrupt)
	}
	s, err := decodeSnapshot(buf)
	if err != nil {
		return nil, fmt.Errorf("fs: metadata generation %d: %w", gen, err)
	}
	m.gen, m.slot, m.n = gen, slot, n
	return s, nil
}

// written calls each with the ranges of the metadata volume that hold
// the header and the newest snapshot.
func (m *metaStore) written(each func(off, n uint64)) {
	m.mu.Lock()
	slot, n := m.slot, m.n
	m.mu.Unlock()
	each(0, pageid.Size)
	each(uint64(metaSlot0+slot*metaSlotSize), n)
}

// decodeSnapshot decodes and checks a snapshot: a root directory, every
// entry naming an inode, every directory's parent a directory reaching
// the root. The model relies on all of it (rename walks parents).
func decodeSnapshot(b []byte) (*snapshot, error) {
	var s snapshot
	// JSON, not gob: gob trusts the lengths it reads and a damaged
	// snapshot could make it allocate gigabytes (FuzzSnapshot found one);
	// JSON allocates in proportion to its input.
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", pageid.ErrCorrupt, err)
	}
	if s.Version != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", pageid.ErrCorrupt, s.Version, snapshotVersion)
	}
	byIno := make(map[uint64]*inode, len(s.Inodes))
	for _, n := range s.Inodes {
		if n == nil || n.Ino == 0 || n.Ino >= volumeInoBase || byIno[n.Ino] != nil || (n.Ino >= s.NextIno && n.Ino != rootIno) {
			return nil, fmt.Errorf("%w: bad or repeated inode", pageid.ErrCorrupt)
		}
		if n.isReg() && n.Vol == "" {
			return nil, fmt.Errorf("%w: file %d without a data volume", pageid.ErrCorrupt, n.Ino)
		}
		byIno[n.Ino] = n
	}
	if r := byIno[rootIno]; r == nil || !r.isDir() {
		return nil, fmt.Errorf("%w: no root directory", pageid.ErrCorrupt)
	}
	for _, n := range s.Inodes {
		for name, ino := range n.Entries {
			c := byIno[ino]
			if !n.isDir() || c == nil || checkName(name) != 0 || ino == rootIno || (c.isDir() && c.Parent != n.Ino) {
				return nil, fmt.Errorf("%w: directory %d entry %q", pageid.ErrCorrupt, n.Ino, name)
			}
		}
		if !n.isDir() {
			continue
		}
		p, steps := n, 0
		for p.Ino != rootIno {
			if p = byIno[p.Parent]; p == nil || !p.isDir() || steps > len(s.Inodes) {
				return nil, fmt.Errorf("%w: directory %d does not reach the root", pageid.ErrCorrupt, n.Ino)
			}
			steps++
		}
	}
	return &s, nil
}

// save writes an encoded snapshot to the free slot, then flips the header.
func (m *metaStore) save(ctx context.Context, b []byte) error {
	if len(b) > metaSlotSize {
		return fmt.Errorf("fs: metadata of %d bytes: %w", len(b), syscall.ENOSPC)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	slot := 1 - m.slot
	// The chunks at once: one round trip, not one per MiB.
	errs := make([]error, (len(b)+memnode.MaxIO-1)/memnode.MaxIO)
	var wg sync.WaitGroup
	for i := range errs {
		off := i * memnode.MaxIO
		wg.Go(func() {
			errs[i] = m.c.WriteAt(ctx, m.vol, uint64(metaSlot0+slot*metaSlotSize+off), b[off:min(len(b), off+memnode.MaxIO)])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
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
	m.slot, m.n = slot, uint64(len(b))
	return nil
}

func nowNs() int64 { return time.Now().UnixNano() }

package memnode

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// Persistence (pd3 memnode --persist DIR). The store in memory stays the
// serving copy; every mutation is also appended to an ordered, checksummed
// log, and its acknowledgement waits until the entry is on stable storage
// (fdatasync; one sync covers every entry appended meanwhile: group
// commit). A checkpoint writes dirty chunks to per-volume sparse page
// files, syncs them, records the log position they cover, and deletes the
// log segments before it, so the log stays bounded. Recovery loads the
// page files, then replays the log from the checkpoint, in order, and stops
// at the first entry that is torn or does not belong (bad magic, checksum,
// generation or sequence), truncating the log there.
//
// Directory layout:
//
//	vol-ID.pages       a volume's bytes, sparse; TRIM punches holes
//	log-GEN.wal        log segments; GEN increases, never reused
//	checkpoint         {gen, offset, seq} covered by the page files, and
//	                   the volume table at that position
//	volumes.json       the volume table of stores written before the table
//	                   was journaled (read when the checkpoint has none)
//	reserve            1 MiB of room held for the small entries a full
//	                   disk still takes (docs/decisions.md, 7)
//
// The volume table is journaled like the data: CREATE, DELETE and a raised
// fencing token append log entries (ordered with the writes, which is what
// makes a delete and the re-use of its id replay correctly), and the
// checkpoint records the whole table together with its log position in
// one atomic file. Taking the position and the table under the table's
// lock keeps them consistent, so replay applies exactly the changes made
// after the table it starts from.
//
// Log entry (little-endian, 16-byte aligned):
//
//	off size field
//	0   4    magic "PD3L"
//	4   4    CRC32C of bytes 8..end of payload
//	8   8    segment generation (an entry from another segment never replays)
//	16  8    sequence number (consecutive; a gap ends the log)
//	24  1    op: 1 write, 2 trim, 3 create, 4 delete, 5 fence
//	25  1    reserved
//	26  2    volume
//	28  4    payload length
//	32  8    offset
//	40  8    count (trim length)
//	48  …    payload, padded to 16 bytes
//
// What survives what: an acknowledged write survives a process crash and a
// power loss (it was fdatasync'ed before the acknowledgement). A write that
// was applied in memory but not yet acknowledged may be read by another
// connection and still be lost by a crash.

const (
	logMagic    = 0x4c334450 // "PD3L"
	entryHeader = 48
	opLogWrite  = 1
	opLogTrim   = 2
	opLogCreate = 3 // volume id, offset: size, payload: name
	opLogDelete = 4 // volume id, payload: name
	opLogFence  = 5 // volume id, count: the new fencing token, payload: name
	opLogResize = 6 // volume id, offset: the new size, payload: name

	defaultLogLimit = 256 << 20 // checkpoint when the log exceeds this
)

var crcTable = crc32.MakeTable(crc32.Castagnoli) // read-only after init

// writeFileAtomic replaces name with data durably.
func writeFileAtomic(d disk, name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := d.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if err := d.Rename(tmp, name); err != nil {
		return err
	}
	return d.SyncDir(filepath.Dir(name))
}

// persister ties a Store to its directory.
type persister struct {
	dir  string
	disk disk
	log  *plog
	// cpMu allows one checkpoint at a time, and keeps Delete from
	// removing a page file (and freeing its volume id) while a checkpoint
	// may still write it. Lock order: cpMu, then Store.mu.
	cpMu sync.Mutex
	// afterTable, set by tests, runs in a checkpoint between taking the
	// table and writing the chunks: where a RESIZE may fall.
	afterTable func()
}

func (p *persister) pagePath(id uint16) string {
	return filepath.Join(p.dir, "vol-"+strconv.Itoa(int(id))+".pages")
}

// pageFile opens a volume's page file. Files are opened per use, not kept:
// a filesystem on the node may have tens of thousands of volumes.
func (p *persister) pageFile(id uint16) (diskFile, error) {
	return p.disk.OpenFile(p.pagePath(id), os.O_RDWR|os.O_CREATE)
}

// volumeRecord is a volume table entry of the checkpoint (and of the older
// volumes.json): what the wire says of a volume, and its fencing token
// (absent in tables written before fencing, which read as 0).
type volumeRecord struct {
	pageid.VolumeInfo
	Fence uint64 `json:",omitempty"`
}

// OpenPersistent opens (or creates) a persistent store in dir: it loads
// the page files, replays the log from the last checkpoint up to the first
// torn entry, and starts the group-commit syncer.
func OpenPersistent(dir string, capacity uint64) (*Store, error) {
	return OpenPersistentProgress(dir, capacity, nil)
}

// Progress is told, from the opening goroutine, how many bytes of page
// files and log the recovery has read out of how many it will read; the
// last call has done == total.
type Progress func(done, total int64)

// OpenPersistentProgress is OpenPersistent reporting its recovery to
// progress (nil reports nothing): a node holding many GiB takes seconds to
// come up, and an operator should see why.
func OpenPersistentProgress(dir string, capacity uint64, progress Progress) (*Store, error) {
	return openPersistent(osDisk{}, dir, capacity, progress)
}

// openPersistent is OpenPersistentProgress on the disk d.
func openPersistent(d disk, dir string, capacity uint64, progress Progress) (*Store, error) {
	if progress == nil {
		progress = func(int64, int64) {}
	}
	if err := d.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("memnode: %w", err)
	}
	s := NewStore(capacity)
	p := &persister{dir: dir, disk: d}
	// Attached before replay so replayed trims mark their chunks; p.log is
	// set once replay is done (nothing logs before that).
	s.persist = p
	// The checkpoint: the log position and the volume table there.
	var cp checkpoint
	if b, err := d.ReadFile(filepath.Join(dir, "checkpoint")); err == nil {
		if err := json.Unmarshal(b, &cp); err != nil {
			return nil, fmt.Errorf("%w: checkpoint: %v", pageid.ErrCorrupt, err)
		}
	}
	vs := cp.Volumes
	if vs == nil {
		if b, err := d.ReadFile(filepath.Join(dir, "volumes.json")); err == nil {
			if err := json.Unmarshal(b, &vs); err != nil {
				return nil, fmt.Errorf("%w: volumes.json: %v", pageid.ErrCorrupt, err)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("memnode: %w", err)
		}
	}
	names, err := d.Names(dir)
	if err != nil {
		return nil, fmt.Errorf("memnode: %w", err)
	}
	gens := segments(names)
	var total, done int64
	for _, v := range vs {
		if fi, err := d.Stat(p.pagePath(v.ID)); err == nil {
			total += storedBytes(fi)
		}
	}
	for _, g := range gens {
		if fi, err := d.Stat(segPath(dir, g)); err == nil && g >= cp.Gen {
			total += fi.Size()
			if g == cp.Gen {
				total -= min(cp.Offset, fi.Size())
			}
		}
	}
	report := func(n int64) {
		done += n
		progress(min(done, total), total)
	}
	for _, v := range vs {
		if err := s.restoreVolume(v); err != nil {
			return nil, err
		}
		f, err := p.pageFile(v.ID)
		if err != nil {
			return nil, fmt.Errorf("memnode: %w", err)
		}
		err = s.loadPages(v.ID, v.Size, f, report)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	// Page files of volumes the table does not list (deleted before the
	// checkpoint, or created after it and written by a checkpoint that did
	// not complete: the log has all of theirs) must not show through when
	// their id is reused.
	listed := map[string]bool{}
	for _, v := range vs {
		listed[p.pagePath(v.ID)] = true
	}
	for _, n := range names {
		if o := filepath.Join(dir, n); strings.HasPrefix(n, "vol-") && strings.HasSuffix(n, ".pages") && !listed[o] {
			d.Remove(o)
		}
	}
	// Log replay from the checkpoint.
	l := &plog{dir: dir, disk: d, kick: make(chan struct{}, 1), done: make(chan struct{}), next: cp.Seq, gen: cp.Gen, limit: defaultLogLimit}
	l.cond.L = &l.mu
	lastGen := cp.Gen
	for _, g := range gens {
		if g < cp.Gen {
			d.Remove(segPath(dir, g)) // covered by the checkpoint
			continue
		}
		start := int64(0)
		if g == cp.Gen {
			start = cp.Offset
		}
		end, next, torn, err := s.replay(segPath(dir, g), g, start, l.next, report)
		if err != nil {
			return nil, err
		}
		l.next, lastGen = next, g
		if torn {
			// Everything after the first bad entry is discarded, later
			// segments included: order matters more than quantity.
			if err := d.Truncate(segPath(dir, g), end); err != nil {
				return nil, fmt.Errorf("memnode: truncating the torn log tail: %w", err)
			}
			for _, later := range gens {
				if later > g {
					d.Remove(segPath(dir, later))
				}
			}
			break
		}
	}
	progress(total, total)
	l.durable = l.next
	// Continue in a fresh segment: the old ones are read-only from now on.
	l.gen = max(lastGen, cp.Gen) + 1
	f, err := d.OpenFile(segPath(dir, l.gen), os.O_RDWR|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return nil, fmt.Errorf("memnode: %w", err)
	}
	if err := d.SyncDir(dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("memnode: %w", err)
	}
	l.f = f
	if l.reserved = l.fillReserve(); !l.reserved {
		// Opened on a full disk: data waits for room (the syncer retries).
		l.full = fmt.Errorf("%w: no room for the reserve of %d bytes", pageid.ErrNoSpace, reserveBytes)
		l.isFull.Store(true)
		l.retry = time.AfterFunc(fullRetry, l.poke)
	}
	for _, g := range gens {
		if fi, err := d.Stat(segPath(dir, g)); err == nil {
			l.size += fi.Size()
		}
	}
	p.log = l
	go l.syncer()
	return s, nil
}

// segments are the generations of the log segments among a directory's
// names, oldest first.
func segments(names []string) []uint64 {
	var gens []uint64
	for _, n := range names {
		if strings.HasPrefix(n, "log-") && strings.HasSuffix(n, ".wal") {
			g, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(n, "log-"), ".wal"), 10, 64)
			if err == nil {
				gens = append(gens, g)
			}
		}
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i] < gens[j] })
	return gens
}

// replay applies the valid entries of one segment from start and returns
// where the valid part ends, the next sequence number, and whether it
// stopped at a torn or foreign entry (rather than the end of the file).
func (s *Store) replay(path string, gen uint64, start int64, seq uint64, report func(int64)) (int64, uint64, bool, error) {
	data, err := s.persist.disk.ReadFile(path)
	if err != nil {
		return 0, 0, false, fmt.Errorf("memnode: %w", err)
	}
	off, reported := start, start
	defer func() { report(off - reported) }()
	for off < int64(len(data)) {
		if off-reported >= ChunkSize {
			report(off - reported)
			reported = off
		}
		e := data[off:]
		if len(e) < entryHeader || binary.LittleEndian.Uint32(e) != logMagic {
			return off, seq, true, nil
		}
		n := int(binary.LittleEndian.Uint32(e[28:]))
		if n > MaxPayload || entryHeader+n > len(e) {
			return off, seq, true, nil
		}
		if crc32.Checksum(e[8:entryHeader+n], crcTable) != binary.LittleEndian.Uint32(e[4:]) ||
			binary.LittleEndian.Uint64(e[8:]) != gen || binary.LittleEndian.Uint64(e[16:]) != seq {
			return off, seq, true, nil
		}
		vol := binary.LittleEndian.Uint16(e[26:])
		at := binary.LittleEndian.Uint64(e[32:])
		payload := e[entryHeader : entryHeader+n]
		switch e[24] {
		case opLogWrite:
			err = s.apply(vol, at, payload, true)
		case opLogTrim:
			err = s.applyTrim(vol, at, binary.LittleEndian.Uint64(e[40:]))
		case opLogCreate:
			err = s.restoreVolume(volumeRecord{VolumeInfo: pageid.VolumeInfo{ID: vol, Size: at, Name: string(payload)}})
		case opLogDelete:
			err = s.replayDelete(vol, string(payload))
		case opLogFence:
			err = s.replayFence(vol, string(payload), binary.LittleEndian.Uint64(e[40:]))
		case opLogResize:
			err = s.replayResize(vol, string(payload), at)
		default:
			return off, seq, true, nil
		}
		if err != nil && !errors.Is(err, pageid.ErrNoVolume) {
			return 0, 0, false, fmt.Errorf("%w: replaying entry %d: %v", pageid.ErrCorrupt, seq, err)
		}
		seq++
		off += int64(pad16(entryHeader + n))
	}
	return off, seq, false, nil
}

// replayDelete applies a logged DELETE: the volume must be the one named
// (an id re-used by a later CREATE replays after it).
func (s *Store) replayDelete(id uint16, name string) error {
	s.mu.Lock()
	v, err := s.loggedLocked(id, name, "deleting")
	if err == nil {
		delete(s.byName, name)
		delete(s.byID, id)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.dropVolume(v)
	return nil
}

// replayResize applies a logged RESIZE; one the checkpoint already holds
// (its table has the size or more) changes nothing.
func (s *Store) replayResize(id uint16, name string, size uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loggedLocked(id, name, "resizing")
	if err == nil {
		v.grow(size)
	}
	return err
}

// replayFence applies a logged fencing token.
func (s *Store) replayFence(id uint16, name string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loggedLocked(id, name, "fencing")
	if err == nil && token > v.fence.Load() {
		v.fence.Store(token)
	}
	return err
}

// loggedLocked is the volume a table entry of the log names: it must have
// the id and the name (an id re-used by a later CREATE replays after it).
func (s *Store) loggedLocked(id uint16, name, doing string) (*volume, error) {
	v, ok := s.byID[id]
	if !ok {
		return nil, fmt.Errorf("%s volume %d %q: %w", doing, id, name, pageid.ErrNoVolume)
	}
	if v.info.Name != name {
		return nil, fmt.Errorf("%s volume %d %q: the table has %q", doing, id, name, v.info.Name)
	}
	return v, nil
}

// storedBytes is how much of a sparse page file holds data (what
// loadPages reads, within a chunk per extent).
func storedBytes(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return min(st.Blocks*512, fi.Size())
	}
	return fi.Size()
}

// loadPages reads a volume's page file up to the volume's size in the
// table, allocating chunks only where the file has data (holes stay
// unallocated). Bytes past the size are from a checkpoint that did not
// complete, written after the volume grew: the log holds the growth and
// every write after it, and replays them.
func (s *Store) loadPages(id uint16, size uint64, f diskFile, report func(int64)) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, ChunkSize)
	for off := int64(0); off < min(fi.Size(), int64(size)); {
		data, err := f.SeekData(off)
		if err != nil {
			break // ENXIO: no data past off
		}
		chunkStart := data &^ (ChunkSize - 1)
		if chunkStart >= int64(size) {
			break
		}
		n, err := f.ReadAt(buf[:min(ChunkSize, int64(size)-chunkStart)], chunkStart)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("memnode: loading volume %d: %w", id, err)
		}
		if n > 0 {
			if err := s.apply(id, uint64(chunkStart), buf[:n], false); err != nil {
				return fmt.Errorf("%w: loading volume %d: %v", pageid.ErrCorrupt, id, err)
			}
			report(int64(n))
		}
		off = chunkStart + ChunkSize
	}
	return nil
}

func crc32Checksum(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

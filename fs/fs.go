package fs

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/caslease"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Config describes a filesystem.
type Config struct {
	// Name tells filesystems on one memory node apart: its volumes are
	// "fs.NAME.meta" and "fs.NAME.INO". Default "pd3".
	Name string
	// Backend holds the filesystem's volumes: one memory node (a
	// *memnode.Client), or a replica.Group over many.
	Backend Backend
	Store   *pagestore.Store
	// Volumes appear as files under volumes/ (the NBD exports' pages, read
	// and written through the same cache).
	Volumes []pageid.VolumeInfo
	// Capacity is what statfs reports as the size (0: 1 PiB; the memory
	// node does not say how much it holds).
	Capacity uint64
	// SyncInterval is how often changed metadata is written back without
	// an fsync (0: 1 s; negative: only on fsync and Close).
	SyncInterval time.Duration
	// LeaseTTL is how long the mount lease lasts without renewal (default
	// 5 s): after a host crash, the next Open waits up to this long.
	LeaseTTL time.Duration
	// Fencing, if set, replaces the lease at the memory node: the caller
	// holds the mount elsewhere (the control plane) and calls Fence when
	// it loses it, and the mount's writes carry a fencing token, so that
	// the memory node refuses the late writes of a host that held it
	// before.
	Fencing *Fencing
	// OnRead, if set, sees every READ's first page key and page count,
	// and the file's end in pages, before the read is served: the agent's
	// request mirror for FUSE.
	OnRead func(first pageid.Key, pages int, end uint64)
	// OnWrite, if set, sees the pages of every WRITE once they are in the
	// host cache (the agent's Host View adds them).
	OnWrite func(first pageid.Key, pages int)
	// Busy, if set, counts the READs and WRITEs being served (servedFS),
	// beside the host's other front ends: the memory-node client's
	// reader waits in poll(2) only while the host serves one request
	// (sockio.Busy).
	Busy *sockio.Busy
	// Procs, if set, is told of every request but FORGET, locks and
	// ioctls (procgov.Governor.Other, in servedFS): they need every P
	// back.
	Procs *procgov.Governor
	Log   *slog.Logger
}

// Backend is where a filesystem's volumes live. A Backend that is also a
// caslease.CAS (one memory node: a *memnode.Client) holds the mount lease
// itself; with any other, the mount must be held elsewhere
// (Config.Fencing), or Open refuses.
type Backend interface {
	OpenOrCreate(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error)
	Create(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error)
	Delete(ctx context.Context, name string) error
	DeleteFenced(ctx context.Context, name string, token uint64) error
	// List is every volume there (only the filesystem's are looked at),
	// with the memory each holds.
	List(ctx context.Context) ([]pageid.VolumeInfo, error)
	ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error
	WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error
}

// Fencing is how a mount held outside the memory node takes and shows its
// fencing token.
type Fencing struct {
	// Token takes the mount's token, once it is held: newer than every
	// token a previous holder took. meta is the metadata volume's id.
	Token func(ctx context.Context, meta uint16) (uint64, error)
	// Present presents token for volume vol on every connection the
	// mount's writes take (the host's, and a split agent's).
	Present func(ctx context.Context, vol uint16, token uint64) error
}

// FS is the filesystem model: inodes, directories and their persistence.
// Data lives in the inode for files of a page or less (inline.go), else in
// one memory-node volume per regular file, read and written
// through the page store. mu guards all inodes; an inode's own io lock
// orders its data writes (shared) against truncation (exclusive).
type FS struct {
	cfg  Config
	meta metaStore

	mu      sync.RWMutex
	inodes  map[uint64]*inode
	nextIno uint64
	changes uint64 // bumped by every metadata change
	saved   uint64 // changes covered by what the metadata volume holds
	// dirty and dents are what changed since the last journal record:
	// inodes, and directory entries by directory and name.
	dirty map[uint64]struct{}
	dents map[dentKey]struct{}
	// snapshotDue makes the next sync write a snapshot, not a record:
	// there is none yet, or a write failed and the journal may have
	// lost a record.
	snapshotDue bool
	vols        map[uint16]pageid.VolumeInfo
	byVol       map[uint16]*inode // regular files by data volume id
	follower    Follower          // SetFollower

	storedCache storedCache // st_blocks and statfs

	// What the mount served (Stats).
	reads, readBytes, writes, writtenBytes atomic.Uint64
	// unstaled counts files whose stale tails were zeroed (stale.go).
	unstaled atomic.Uint64

	syncMu sync.Mutex // serialises snapshots
	lease  caslease.Lease
	token  uint64      // with cfg.Fencing: the mount's fencing token
	fenced atomic.Bool // the lease was lost: write nothing more
	stop   chan struct{}
	done   chan struct{}
	// deletes are the volumes of freed files, deleted at the memory node
	// in the background: an unlink does not wait for that round trip. A
	// crash before they are deleted leaves orphans the next Open deletes.
	deletes chan string
	pending atomic.Int64  // queued in deletes or being deleted
	deleted chan struct{} // closed once the deleter has emptied deletes at Close
	pool    *volumePool
	// ra reads streams ahead; raStop ends its reads at Close.
	ra     *readAhead
	raStop context.CancelFunc
	// seed makes listing cookies (dirs.go); lists keeps listings.
	seed  maphash.Seed
	lists dirLists
}

// DefaultName is the filesystem's name when its Config names none.
const DefaultName = "pd3"

// CheckName refuses a filesystem name that cannot name its volumes at a
// memory node (they are called fs.NAME.*).
func CheckName(name string) error {
	if name == "" || strings.ContainsAny(name, "./") {
		return fmt.Errorf("name %q may be neither empty nor contain '.' or '/'", name)
	}
	return nil
}

// Open loads (or creates) the filesystem called cfg.Name at the memory
// node, deletes data volumes that no snapshot refers to (files created
// after the last snapshot before a crash) and starts the metadata syncer.
func Open(ctx context.Context, cfg Config) (*FS, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if err := CheckName(cfg.Name); err != nil {
		return nil, fmt.Errorf("fs: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	node, onNode := cfg.Backend.(caslease.CAS)
	if !onNode && cfg.Fencing == nil {
		return nil, errors.New("fs: a filesystem over many memory nodes is held through the control plane: Fencing is needed")
	}
	mv, err := cfg.Backend.OpenOrCreate(ctx, "fs."+cfg.Name+".meta", metaVolSize)
	if err != nil {
		return nil, fmt.Errorf("fs: metadata volume: %w", err)
	}
	f := &FS{
		seed:    maphash.MakeSeed(),
		cfg:     cfg,
		meta:    metaStore{c: cfg.Backend, vol: mv.ID},
		inodes:  make(map[uint64]*inode),
		dirty:   make(map[uint64]struct{}),
		dents:   make(map[dentKey]struct{}),
		vols:    make(map[uint16]pageid.VolumeInfo),
		byVol:   make(map[uint16]*inode),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		deletes: make(chan string, pendingDeletes),
		deleted: make(chan struct{}),
	}
	for _, v := range cfg.Volumes {
		f.vols[v.ID] = v
	}
	if cfg.Fencing != nil {
		// Before anything is written: the metadata volume first, the data
		// volumes as they are found below.
		if f.token, err = cfg.Fencing.Token(ctx, mv.ID); err != nil {
			return nil, fmt.Errorf("fs: taking the mount's fencing token: %w", err)
		}
		if err := f.present(ctx, mv.ID); err != nil {
			return nil, err
		}
	} else {
		f.lease = caslease.Lease{C: node, Vol: mv.ID, Off: leaseOff, TTL: cfg.LeaseTTL}
		if err := f.lease.Acquire(ctx, cfg.LeaseTTL+time.Second); err != nil {
			return nil, mountErr(err)
		}
	}
	snap, err := f.meta.load(ctx)
	if err != nil {
		if cfg.Fencing == nil {
			f.lease.Release(ctx)
		}
		return nil, err
	}
	if snap == nil {
		now := nowNs()
		snap = &snapshot{Version: snapshotVersion, NextIno: firstIno, Inodes: []*inode{{
			attrs: attrs{
				Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno,
				Atime: now, Mtime: now, Ctime: now,
			},
			Entries: map[string]uint64{},
		}}}
		f.changes, f.snapshotDue = 1, true
	}
	// Cleared before anything is written, so that a crash of this mount
	// is seen by the next even if it happens now.
	clean, err := f.meta.takeClean(ctx)
	if err != nil {
		if cfg.Fencing == nil {
			f.lease.Release(ctx)
		}
		return nil, err
	}
	f.nextIno = snap.NextIno
	// A tree saved by an older pd3 gets a snapshot of this version before
	// any record: that pd3 would read the old one and skip the journal.
	f.snapshotDue = f.snapshotDue || snap.Version < snapshotVersion
	all, err := cfg.Backend.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("fs: listing volumes: %w", err)
	}
	byName := make(map[string]pageid.VolumeInfo, len(all))
	for _, v := range all {
		byName[v.Name] = v
	}
	for _, n := range snap.Inodes {
		f.inodes[n.Ino] = n
		if n.Entries == nil && n.isDir() {
			n.Entries = map[string]uint64{}
		}
		if !n.isReg() || n.inline() {
			continue
		}
		v, ok := byName[n.Vol]
		if !ok {
			return nil, fmt.Errorf("fs: file %d: %w: its data volume %q is missing", n.Ino, pageid.ErrCorrupt, n.Vol)
		}
		delete(byName, n.Vol)
		n.vol = v.ID
		if !clean {
			n.markStale(n.Size)
		}
		f.byVol[v.ID] = n
		if err := f.present(ctx, v.ID); err != nil {
			return nil, err
		}
		cfg.Store.AddVolume(v)
	}
	if f.inodes[rootIno] == nil {
		return nil, fmt.Errorf("fs: %w: no root directory", pageid.ErrCorrupt)
	}
	var used []string
	for _, n := range snap.Inodes {
		used = append(used, n.Vol)
	}
	f.pool = newVolumePool(poolSeq(cfg.Name, used))
	prefix := "fs." + cfg.Name + "."
	for name := range byName {
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "meta" {
			cfg.Log.Info("fs: deleting a data volume no snapshot refers to", "volume", name)
			if err := f.deleteVolume(ctx, name); err != nil {
				return nil, fmt.Errorf("fs: deleting orphan %q: %w", name, err)
			}
		}
	}
	var raCtx context.Context
	raCtx, f.raStop = context.WithCancel(context.WithoutCancel(ctx))
	f.ra = newReadAhead(raCtx, cfg.Store.ReadStream)
	go f.syncLoop()
	go f.deleter()
	go f.fillPool()
	return f, nil
}

// Close writes back dirty pages and the metadata, stops the syncer and
// gives up the lease. The mount must be gone.
func (f *FS) Close(ctx context.Context) error {
	f.raStop()
	f.ra.wait()
	close(f.stop)
	<-f.done
	<-f.deleted
	f.emptyPool(ctx)
	if err := f.Sync(ctx); err != nil {
		return err
	}
	if !f.fenced.Load() {
		if err := f.meta.markClean(ctx); err != nil {
			// Everything is saved; without the mark the next mount
			// only zeroes the files' tails as after a crash.
			f.cfg.Log.Warn("fs: unmounted without the clean mark", "err", err)
		}
	}
	if f.cfg.Fencing != nil {
		return nil // the holder lets the mount go
	}
	return f.lease.Release(ctx)
}

// present shows the mount's fencing token for volume vol (with Fencing).
func (f *FS) present(ctx context.Context, vol uint16) error {
	if f.cfg.Fencing == nil {
		return nil
	}
	if err := f.cfg.Fencing.Present(ctx, vol, f.token); err != nil {
		return fmt.Errorf("fs: presenting the mount's fencing token: %w", err)
	}
	return nil
}

// deleteVolume frees a volume of the filesystem; with Fencing, the
// mount's token goes with it, so that a DELETE from a mount superseded
// while it was on the way cannot free a file of the mount that replaced
// it.
func (f *FS) deleteVolume(ctx context.Context, name string) error {
	if f.cfg.Fencing == nil {
		return f.cfg.Backend.Delete(ctx, name)
	}
	return f.cfg.Backend.DeleteFenced(ctx, name, f.token)
}

// Fenced reports whether Fence (or a lease lost at the node) stopped
// the mount.
func (f *FS) Fenced() bool { return f.fenced.Load() }

// Fence stops the mount for good because its holder lost it (Fencing):
// changes are refused with EROFS, and the cached pages of its files are
// dropped unwritten, as another host may own the tree by now.
func (f *FS) Fence() {
	f.fenced.Store(true)
	f.mu.RLock()
	vols := make([]uint16, 0, len(f.byVol))
	for v := range f.byVol {
		vols = append(vols, v)
	}
	f.mu.RUnlock()
	for _, v := range vols {
		f.cfg.Store.FenceVolume(v)
	}
}

// KeyOf maps a page of an inode, as the kernel numbers them, to its page
// key, for the page-cache tracker.
func (f *FS) KeyOf(ino, index uint64) (pageid.Key, bool) {
	if ino > volumeInoBase {
		v, ok := f.vols[uint16(ino-volumeInoBase)]
		if !ok || index >= v.Size/pageid.Size {
			return 0, false
		}
		return pageid.MakeKey(v.ID, index), true
	}
	f.mu.RLock()
	n := f.inodes[ino]
	var vol uint16
	if n != nil {
		vol = n.vol
	}
	f.mu.RUnlock()
	if vol == 0 || index >= MaxFileSize/pageid.Size {
		return 0, false
	}
	return pageid.MakeKey(vol, index), true
}

// EndOf returns the end, in pages, of the file whose page k is (0 if k
// belongs to no file): predictions stop there.
func (f *FS) EndOf(k pageid.Key) uint64 {
	if v, ok := f.vols[k.Volume()]; ok {
		return v.Size / pageid.Size
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n := f.byVol[k.Volume()]; n != nil {
		return (n.Size + pageid.Size - 1) / pageid.Size
	}
	return 0
}

// ReadingAhead reports whether the mount reads the file of page k ahead
// itself (a stream whose next windows are on the way): a prefetcher that
// follows the same reader would fetch those pages a second time.
func (f *FS) ReadingAhead(k pageid.Key) bool {
	f.mu.RLock()
	n := f.byVol[k.Volume()]
	f.mu.RUnlock()
	return n != nil && n.streams.active()
}

// Written calls each with the byte ranges of volume vol that hold the
// filesystem's data (the metadata's header and newest snapshot; a file's
// bytes up to the furthest it was written): what a copy of the volume
// made elsewhere must carry. Nothing for a volume that is not the
// filesystem's.
func (f *FS) Written(vol uint16, each func(off, n uint64)) {
	if vol == f.meta.vol {
		f.meta.written(each)
		return
	}
	f.mu.RLock()
	var end uint64
	if n := f.byVol[vol]; n != nil {
		end = n.written()
	}
	f.mu.RUnlock()
	if end > 0 {
		each(0, end)
	}
}

// newVolume is the data volume of a file growing past its inode: one made ahead
// (pool.go), or else one made now, named after the inode. A volume left by
// a crashed run under that name (its inode number was handed out but
// never saved) is replaced.
func (f *FS) newVolume(ctx context.Context, ino uint64) (pageid.VolumeInfo, error) {
	if v, ok := f.takeVolume(); ok {
		f.cfg.Store.AddVolume(v)
		return v, nil
	}
	name := "fs." + f.cfg.Name + "." + strconv.FormatUint(ino, 10)
	v, err := f.cfg.Backend.Create(ctx, name, MaxFileSize)
	if errors.Is(err, pageid.ErrExists) {
		if err = f.deleteVolume(ctx, name); err == nil {
			v, err = f.cfg.Backend.Create(ctx, name, MaxFileSize)
		}
	}
	if err != nil {
		return v, err
	}
	if err := f.present(ctx, v.ID); err != nil {
		return v, err
	}
	f.cfg.Store.AddVolume(v)
	return v, nil
}

// release frees an inode that has no names and no open handles.
func (f *FS) release(ctx context.Context, n *inode) {
	f.mu.Lock()
	delete(f.inodes, n.Ino)
	if f.byVol[n.vol] == n {
		delete(f.byVol, n.vol)
	}
	f.changedLocked(n)
	end := n.written() / pageid.Size
	f.mu.Unlock()
	f.ra.changed(n)
	if n.vol == 0 || f.fenced.Load() {
		return // fenced: the volume may be another holder's file now
	}
	f.cfg.Store.RemoveVolumePages(n.vol, end)
	f.pending.Add(1)
	select {
	case f.deletes <- n.Vol:
	default: // the deleter is behind: this caller waits for the round trip
		// The inode is gone whatever becomes of the request: an
		// interrupted unlink must not leave its volume behind.
		f.freeVolume(context.WithoutCancel(ctx), n.Vol)
		f.pending.Add(-1)
	}
}

// Stats is what a mount served: READ and WRITE requests with their bytes
// (a READ's as asked, up to the file's size), and the files whose tails
// past their size were zeroed after a crashed mount (stale.go).
type Stats struct {
	Reads, ReadBytes, Writes, WrittenBytes uint64
	StaleTailsZeroed                       uint64
}

// Stats returns the mount's counters.
func (f *FS) Stats() Stats {
	return Stats{
		Reads: f.reads.Load(), ReadBytes: f.readBytes.Load(),
		Writes: f.writes.Load(), WrittenBytes: f.writtenBytes.Load(),
		StaleTailsZeroed: f.unstaled.Load(),
	}
}

// PendingDeletes is how many freed files' volumes are not deleted at the
// memory node yet (queued, or their DELETE in flight).
func (f *FS) PendingDeletes() int { return int(f.pending.Load()) }

// pendingDeletes bounds the volumes of freed files waiting for the
// deleter.
const pendingDeletes = 1024

// deleter deletes the volumes of freed files until the syncer stops (at
// Close, or when the host goes away without it), then those still
// queued.
func (f *FS) deleter() {
	defer close(f.deleted)
	ctx := context.Background()
	free := func(name string) {
		f.freeVolume(ctx, name)
		f.pending.Add(-1)
	}
	for {
		select {
		case name := <-f.deletes:
			free(name)
		case <-f.done:
			drain(f.deletes, free)
			return
		}
	}
}

// drain calls fn with each value ch holds now, without waiting for more.
func drain[T any](ch <-chan T, fn func(T)) {
	for {
		select {
		case x := <-ch:
			fn(x)
		default:
			return
		}
	}
}

// freeVolume deletes the volume of a freed file at the memory node.
func (f *FS) freeVolume(ctx context.Context, name string) {
	if f.fenced.Load() {
		return // the volume may be another holder's file now
	}
	if err := f.deleteVolume(ctx, name); err != nil {
		// The next mount deletes it as an orphan.
		f.cfg.Log.Warn("fs: freeing a deleted file's volume", "volume", name, "err", err)
	}
}

// writable refuses changes once the lease is lost: another host owns the
// tree now, and what this one wrote would be deleted as orphans.
func (f *FS) writable() syscall.Errno {
	if f.fenced.Load() {
		return syscall.EROFS
	}
	return 0
}

// errno maps an error from below to what the caller should see.
func (f *FS) errno(op string, err error) syscall.Errno {
	var e syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e
	case errors.Is(err, pageid.ErrNoMemory), errors.Is(err, pageid.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, pageid.ErrOutOfRange):
		return syscall.EFBIG
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	f.cfg.Log.Warn("fs: I/O error", "op", op, "err", err)
	return syscall.EIO
}

// fillAttr copies n's attributes for the kernel; mu must be held.
func (f *FS) fillAttr(n *inode, a *fuse.Attr) {
	a.Ino = n.Ino
	a.Mode = n.Mode
	a.Nlink = n.Nlink
	if n.Ino == rootIno {
		// volumes/ is a subdirectory too; find(1) trusts nlink-2.
		a.Nlink++
	}
	a.Size = n.Size
	// st_blocks counts what the node stores for the file (whole chunks),
	// so du and cp --sparse see a sparse file as sparse. Directories and
	// symlinks hold no pages: they live in the metadata snapshot.
	a.Blocks = 0
	if n.vol != 0 {
		stored, _ := f.storedOf(n.vol)
		a.Blocks = stored / 512
		n.shownStored.Store(stored + 1)
	} else if n.inline() {
		a.Blocks = pageUp(uint64(len(n.Data))) / 512
	}
	a.Blksize = pageid.Size
	a.Rdev = n.Rdev
	a.Uid, a.Gid = n.UID, n.GID
	a.Atime, a.Atimensec = uint64(n.Atime/1e9), uint32(n.Atime%1e9)
	a.Mtime, a.Mtimensec = uint64(n.Mtime/1e9), uint32(n.Mtime%1e9)
	a.Ctime, a.Ctimensec = uint64(n.Ctime/1e9), uint32(n.Ctime%1e9)
}

func checkName(name string) syscall.Errno {
	if len(name) > maxName {
		return syscall.ENAMETOOLONG
	}
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return syscall.EINVAL
	}
	return 0
}

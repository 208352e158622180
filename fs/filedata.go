package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/pageid"
	"golang.org/x/sys/unix"
)

// A file's data: open and release, read (cached, or streamed for large
// reads), write, fsync and fallocate.

// Lseek answers ENOSYS, so that the kernel answers SEEK_DATA and
// SEEK_HOLE itself from the size it knows, for every file of the mount
// from then on: with its writeback cache it holds writes the mount has
// not seen, and go-fuse's answer from the mount's size said "no data" at
// offset 0 of a file just written (TestSeekDataSeesCachedWrites). The
// kernel's answer reports no holes, which every sparse-aware reader
// handles.
func (n *node) Lseek(ctx context.Context, _ gofs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	return 0, syscall.ENOSYS
}

var _ gofs.NodeLseeker = (*node)(nil)

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	f := n.f
	f.mu.Lock()
	c := f.inodes[n.ino]
	if c == nil {
		f.mu.Unlock()
		return nil, 0, syscall.ENOENT
	}
	if !c.isReg() {
		f.mu.Unlock()
		return nil, 0, syscall.EISDIR
	}
	c.opens++
	f.unlockFollowing(c)
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		if e := n.truncate(ctx, 0); e != 0 {
			n.Release(ctx, nil)
			return nil, 0, e
		}
	}
	return newHandle(c), fuse.FOPEN_KEEP_CACHE, 0
}

func (n *node) Release(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	f := n.f
	h, _ := fh.(*handle)
	f.mu.Lock()
	c := f.inodes[n.ino]
	if c == nil {
		f.mu.Unlock()
		if h != nil {
			f.ra.stop(&h.stream)
		}
		return 0
	}
	c.opens--
	free := c.opens == 0 && c.Nlink == 0
	f.mu.Unlock()
	if h != nil {
		f.ra.close(c, &h.stream) // its reader is gone: give the budget back
	}
	if free {
		f.release(context.WithoutCancel(ctx), c)
	}
	return 0
}

// file returns a regular file's inode, data volume and size.
func (n *node) file() (c *inode, vol uint16, size uint64, e syscall.Errno) {
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	c = n.f.inodes[n.ino]
	if c == nil {
		return nil, 0, 0, syscall.ENOENT
	}
	if !c.isReg() {
		return nil, 0, 0, syscall.EISDIR
	}
	return c, c.vol, c.Size, 0
}

// streamRead is the size from which a FUSE read bypasses the host cache
// (pagestore.Store.ReadStream) and is read ahead by the mount: the
// kernel's read-ahead of a sequential reader (128 KiB READs under memory
// pressure), or a large direct read (docs/decisions.md, 5).
const streamRead = 128 << 10

func (n *node) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	ctx = uninterrupted(ctx)
	c, vol, size, e := n.file()
	if e != 0 {
		return nil, e
	}
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if uint64(off) >= size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(uint64(len(dest)), size-uint64(off))]
	n.f.reads.Add(1)
	n.f.readBytes.Add(uint64(len(dest)))
	c.io.RLock()
	if vol == 0 {
		k, ok := n.f.readInline(c, uint64(off), dest)
		if ok {
			c.io.RUnlock()
			return fuse.ReadResultData(dest[:k]), 0
		}
		vol = n.f.volOf(c) // it got a volume since
	}
	h, _ := fh.(*handle)
	scan := h != nil && len(dest) < streamRead && h.stream.scanning(uint64(off), len(dest))
	// No read-ahead hint for a stream's read: ReadStream reads its runs
	// from the node itself, and pages the agent prefetched for the next
	// ones cost a copy into the Loading Zone and one out of it
	// (docs/decisions.md, 18).
	if n.f.cfg.OnRead != nil && len(dest) < streamRead && !scan {
		first := uint64(off) / pageid.Size
		last := (uint64(off) + uint64(len(dest)) - 1) / pageid.Size
		n.f.cfg.OnRead(pageid.MakeKey(vol, first), int(last-first+1), (size+pageid.Size-1)/pageid.Size)
	}
	var err error
	switch {
	case scan:
		scanAhead(n.f.cfg.Store, vol, (uint64(off)+uint64(len(dest))-1)/pageid.Size, (size+pageid.Size-1)/pageid.Size)
		err = n.f.cfg.Store.ReadStream(ctx, vol, uint64(off), dest)
	case len(dest) >= streamRead:
		if h != nil {
			if res, ok := n.f.ra.take(ctx, c, &h.stream, vol, uint64(off), len(dest), size); ok {
				c.io.RUnlock()
				return res, 0
			}
		}
		err = n.f.cfg.Store.ReadStream(ctx, vol, uint64(off), dest)
	default:
		err = n.f.cfg.Store.ReadRange(ctx, vol, uint64(off), dest)
	}
	c.io.RUnlock()
	if err != nil {
		return nil, n.f.errno("read", err)
	}
	return fuse.ReadResultData(dest), 0
}

func (n *node) Write(ctx context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	ctx = uninterrupted(ctx)
	if e := n.f.writable(); e != 0 {
		return 0, e
	}
	c, vol, size, e := n.file()
	if e != 0 {
		return 0, e
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	end := uint64(off) + uint64(len(data))
	if end > MaxFileSize {
		return 0, syscall.EFBIG
	}
	n.f.writes.Add(1)
	n.f.writtenBytes.Add(uint64(len(data)))
	if vol == 0 {
		if vol, e = n.writeInline(ctx, c, uint64(off), data); e != 0 {
			return 0, e
		}
		if vol == 0 {
			return uint32(len(data)), 0 // in the inode
		}
	}
	c.io.RLock()
	if err := n.f.unstaleShared(ctx, c, vol, end); err != nil {
		c.io.RUnlock()
		return 0, n.f.errno("write", err)
	}
	// Reach before the pages are cached, even if the write fails. Past
	// both the size and what any earlier write reached nothing was
	// written, so a page this write covers in part needs no read of the
	// memory node if what it leaves of the page lies there: a file grown
	// by unaligned appends, whose last page the kernel writes back from
	// its start, would otherwise read that page back each time. size may
	// be stale by a truncation that ran before c.io was taken: one that
	// shrank the file leaves it larger (pages read, as before); one that
	// grew it wrote nothing past it.
	zeroFrom := max(size, c.reach(end))
	err := n.f.cfg.Store.WriteFresh(ctx, vol, uint64(off), data, zeroFrom)
	n.f.ra.changed(c)
	if err != nil && end > size {
		// Pages it cached before it failed may lie past the size.
		c.markStale(max(uint64(off), size))
	}
	if err == nil {
		n.f.mu.Lock()
		c.Size = max(c.Size, end)
		c.touch(nowNs())
		n.f.changedLocked(c)
		n.f.unlockFollowing(c)
	}
	c.io.RUnlock()
	if err == nil && len(data) > 0 && n.f.cfg.OnWrite != nil {
		first := uint64(off) / pageid.Size
		n.f.cfg.OnWrite(pageid.MakeKey(vol, first), int((end-1)/pageid.Size-first+1))
	}
	if err != nil {
		return 0, n.f.errno("write", err)
	}
	return uint32(len(data)), 0
}

// writeInline writes to a file created without a volume: into its inode
// while it fits (vol 0), else it moves the file to a volume and returns
// that for the caller to write to.
func (n *node) writeInline(ctx context.Context, c *inode, off uint64, data []byte) (vol uint16, e syscall.Errno) {
	c.io.RLock()
	done := n.f.writeInline(c, off, data)
	c.io.RUnlock()
	if done {
		return 0, 0
	}
	if err := n.f.moveOut(ctx, c); err != nil {
		return 0, n.f.errno("write", err)
	}
	return n.f.volOf(c), 0
}

// Flush (every close) has nothing to do: the page store holds the data
// and fsync is the durability barrier, as on a local filesystem. ENOSYS
// makes the kernel stop sending FLUSH for the mount (it still writes a
// file's cached pages back on close), saving a round trip per close.
func (n *node) Flush(ctx context.Context, _ gofs.FileHandle) syscall.Errno { return syscall.ENOSYS }

// Fsync of a file writes back that file's dirty pages, then the metadata
// (which holds its size); a directory's fsync saves the metadata.
func (n *node) Fsync(ctx context.Context, _ gofs.FileHandle, flags uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	n.f.mu.RLock()
	c := n.f.inodes[n.ino]
	var vol uint16
	var name string
	if c != nil {
		vol, name = c.vol, c.Vol
	}
	n.f.mu.RUnlock()
	if vol != 0 {
		if err := n.f.cfg.Store.FlushVolume(ctx, vol); err != nil {
			return n.f.errno("fsync", err)
		}
		// With the writeback cache the kernel keeps the attributes it
		// has until they time out; the next stat should show the
		// blocks this fsync stored. Attributes only (offset -1): the
		// pages the kernel holds are the newest. Dropping them when
		// the blocks did not change would cost the next write a
		// GETATTR and a GETXATTR (the kernel forgets that the file has
		// no capabilities): two round trips per fsync of a database
		// that overwrites its pages in place.
		if stored, ok := n.f.storedChanged(ctx, vol, name); !ok || c.shownStored.Load() != stored+1 {
			n.NotifyContent(-1, 0)
		}
	}
	return n.f.errno("fsync", n.f.syncMeta(ctx, false))
}

// Allocate implements fallocate: plain allocation only extends the size
// (the memory node allocates on write, so space is not reserved), punching
// a hole trims the pages, and zeroing a range trims and may extend.
func (n *node) Allocate(ctx context.Context, _ gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	if e := n.f.writable(); e != 0 {
		return e
	}
	const supported = unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE
	if mode&^supported != 0 {
		return syscall.EOPNOTSUPP
	}
	if mode&unix.FALLOC_FL_PUNCH_HOLE != 0 && mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		return syscall.EINVAL
	}
	end := off + size
	if size == 0 || end < off {
		return syscall.EINVAL
	}
	if end > MaxFileSize {
		return syscall.EFBIG
	}
	c, vol, cur, e := n.file()
	if e != 0 {
		return e
	}
	if vol == 0 {
		if err := n.f.moveOut(ctx, c); err != nil {
			return n.f.errno("fallocate", err)
		}
		vol = n.f.volOf(c)
	}
	c.io.RLock()
	defer c.io.RUnlock()
	defer n.f.ra.changed(c)
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		if err := n.f.unstaleShared(ctx, c, vol, end); err != nil {
			return n.f.errno("fallocate", err)
		}
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 && off < cur {
		if err := n.f.cfg.Store.ZeroRange(ctx, vol, off, min(end, cur)-off, false); err != nil {
			return n.f.errno("fallocate", err)
		}
	}
	n.f.mu.Lock()
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 && end > c.Size {
		c.Size = end
	}
	c.touch(nowNs())
	n.f.changedLocked(c)
	n.f.unlockFollowing(c)
	return 0
}

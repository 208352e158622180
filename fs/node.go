package fs

import (
	"context"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/pageid"
	"golang.org/x/sys/unix"
)

// node is the kernel-facing side of an inode of the model; all state is in
// the FS, the go-fuse Inode only tracks what the kernel knows.
type node struct {
	gofs.Inode
	f   *FS
	ino uint64
}

var (
	_ gofs.NodeLookuper      = (*node)(nil)
	_ gofs.NodeGetattrer     = (*node)(nil)
	_ gofs.NodeSetattrer     = (*node)(nil)
	_ gofs.NodeCreater       = (*node)(nil)
	_ gofs.NodeOpener        = (*node)(nil)
	_ gofs.NodeReader        = (*node)(nil)
	_ gofs.NodeWriter        = (*node)(nil)
	_ gofs.NodeFlusher       = (*node)(nil)
	_ gofs.NodeReleaser      = (*node)(nil)
	_ gofs.NodeFsyncer       = (*node)(nil)
	_ gofs.NodeMkdirer       = (*node)(nil)
	_ gofs.NodeRmdirer       = (*node)(nil)
	_ gofs.NodeUnlinker      = (*node)(nil)
	_ gofs.NodeRenamer       = (*node)(nil)
	_ gofs.NodeSymlinker     = (*node)(nil)
	_ gofs.NodeReadlinker    = (*node)(nil)
	_ gofs.NodeLinker        = (*node)(nil)
	_ gofs.NodeStatfser      = (*node)(nil)
	_ gofs.NodeAllocater     = (*node)(nil)
	_ gofs.NodeGetxattrer    = (*node)(nil)
	_ gofs.NodeSetxattrer    = (*node)(nil)
	_ gofs.NodeListxattrer   = (*node)(nil)
	_ gofs.NodeRemovexattrer = (*node)(nil)
)

// handle is an open file; the model counts opens so that an unlinked file
// stays readable until its last close. Each handle reads its own stream
// ahead: two readers of one file do not drop each other's windows.
type handle struct {
	stream stream
}

// newHandle opens a handle on c.
func newHandle(c *inode) *handle {
	h := &handle{}
	c.streams.add(&h.stream)
	return h
}

func caller(ctx context.Context) (uid, gid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// uninterrupted is ctx without the cancellation go-fuse gives it when
// the kernel forwards a signal to the caller (INTERRUPT): a local
// filesystem finishes the read, write or fsync its caller was signalled
// in, and a program that gets EINTR from fsync takes it for a failed one
// (TestSignalsDoNotFailFsync). A fatal signal still ends the caller's
// wait in the kernel; the request then finishes unseen.
func uninterrupted(ctx context.Context) context.Context {
	if fc, ok := ctx.(*fuse.Context); ok {
		return uncancelled{fc}
	}
	return context.WithoutCancel(ctx)
}

// uncancelled is a go-fuse request's context that never ends. It is one
// pointer, so unlike context.WithoutCancel it costs READ and WRITE no
// allocation.
type uncancelled struct{ c *fuse.Context }

func (uncancelled) Deadline() (time.Time, bool) { return time.Time{}, false }
func (uncancelled) Done() <-chan struct{}       { return nil }
func (uncancelled) Err() error                  { return nil }
func (u uncancelled) Value(key any) any         { return u.c.Value(key) }

// dir returns the directory inode of n; mu must be held.
func (n *node) dir() (*inode, syscall.Errno) {
	d := n.f.inodes[n.ino]
	if d == nil {
		return nil, syscall.ENOENT
	}
	if !d.isDir() {
		return nil, syscall.ENOTDIR
	}
	return d, 0
}

// isVolumes reports whether name in n is the synthetic volumes directory,
// which no operation of the model may create, replace or remove.
func (n *node) isVolumes(name string) bool { return n.ino == rootIno && name == volumesName }

// child returns directory n and its entry name, mu held: ENOENT (with d
// set) when the entry is absent.
func (n *node) child(name string) (d, c *inode, e syscall.Errno) {
	if d, e = n.dir(); e != 0 {
		return nil, nil, e
	}
	if c = n.f.inodes[d.Entries[name]]; c == nil {
		return d, nil, syscall.ENOENT
	}
	return d, c, 0
}

func (n *node) newChild(ctx context.Context, c *inode) *gofs.Inode {
	return n.NewInode(ctx, &node{f: n.f, ino: c.Ino}, gofs.StableAttr{Mode: c.Mode & syscall.S_IFMT, Ino: c.Ino})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.isVolumes(name) {
		return n.volumesDir(ctx, out), 0
	}
	if len(name) > maxName {
		return nil, syscall.ENAMETOOLONG
	}
	// The entry's attributes are what a stat after this lookup sees (du
	// looks up each file and asks nothing more).
	n.f.refreshStored(ctx)
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	_, c, e := n.child(name)
	if e != 0 {
		return nil, e
	}
	n.f.fillAttr(c, &out.Attr)
	return n.newChild(ctx, c), 0
}

func (n *node) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.f.refreshStored(ctx)
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	c := n.f.inodes[n.ino]
	if c == nil {
		return syscall.ENOENT
	}
	n.f.fillAttr(c, &out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, _ gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx = uninterrupted(ctx)
	if e := n.f.writable(); e != 0 {
		return e
	}
	if size, ok := in.GetSize(); ok {
		if e := n.truncate(ctx, size); e != 0 {
			return e
		}
	}
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.inodes[n.ino]
	if c == nil {
		return n.setattrFreed(in, out)
	}
	if in.Valid == killOnly {
		// A WRITE's request (killpriv.go): a change of mode
		// only if a bit goes, so that an unprivileged O_DIRECT writer,
		// whose every WRITE carries the request, costs nothing more.
		if m := killSuidgid(c.Mode, outsider(ctx, c)); m != c.Mode {
			c.Mode = m
			c.Ctime = nowNs()
			f.changedLocked(c)
		}
		n.f.fillAttr(c, &out.Attr)
		return 0
	}
	now := nowNs()
	if m, ok := in.GetMode(); ok {
		c.Mode = c.Mode&syscall.S_IFMT | m&0o7777
	}
	// The kernel's request to clear set-ID bits, with a truncation or
	// chown by whoever lacks CAP_FSETID (and any chown), is judged
	// against the group the file had.
	outside := outsider(ctx, c)
	if uid, ok := in.GetUID(); ok {
		c.UID = uid
	}
	if gid, ok := in.GetGID(); ok {
		c.GID = gid
	}
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 {
		c.Mode = killSuidgid(c.Mode, outside)
	}
	if t, ok := in.GetATime(); ok {
		c.Atime = t.UnixNano()
	}
	if t, ok := in.GetMTime(); ok {
		c.Mtime = t.UnixNano()
	}
	c.Ctime = now
	f.changedLocked(c)
	n.f.fillAttr(c, &out.Attr)
	return 0
}

// timesOnly are the SETATTR fields of the kernel writing back times it
// changed itself (with the writeback cache).
const timesOnly = fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_CTIME |
	fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER

// setattrFreed answers a SETATTR of a file the mount freed: unlinked
// and closed. The kernel may hold its inode a while longer and write
// back the times it changed (the unlink's ctime); nothing is left to
// keep them, and ENOENT surfaced as a failed syncfs(2) of the whole
// mount (TestSyncfsAfterUnlinks). Anything else is refused as before.
func (n *node) setattrFreed(in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&^timesOnly != 0 {
		return syscall.ENOENT
	}
	out.Attr = fuse.Attr{Ino: n.ino, Mode: n.StableAttr().Mode}
	return 0
}

// truncate sets a regular file's size. Bytes past the size are kept zero
// (whole pages trimmed at the memory node), so growing the file again
// reads zeroes.
func (n *node) truncate(ctx context.Context, size uint64) syscall.Errno {
	if size > MaxFileSize {
		return syscall.EFBIG
	}
	f := n.f
	f.mu.RLock()
	c := f.inodes[n.ino]
	f.mu.RUnlock()
	if c == nil {
		return syscall.ENOENT
	}
	if !c.isReg() {
		return syscall.EISDIR
	}
	c.io.Lock()
	defer c.io.Unlock()
	defer f.ra.changed(c)
	if f.truncateInline(c, size) {
		return 0
	}
	if err := f.promote(ctx, c); err != nil {
		return f.errno("truncate", err)
	}
	f.mu.RLock()
	old, vol := c.Size, c.vol
	f.mu.RUnlock()
	if err := f.unstale(ctx, c, vol, size); err != nil {
		return f.errno("truncate", err)
	}
	if size < old {
		end := pageUp(old)
		if err := f.cfg.Store.ZeroRange(ctx, vol, size, end-size, false); err != nil {
			return f.errno("truncate", err)
		}
	}
	f.mu.Lock()
	c.Size = size
	c.touch(nowNs())
	f.changedLocked(c)
	f.mu.Unlock()
	return 0
}

// add links a new inode c under name in n; it fails if the name exists.
func (n *node) add(name string, c *inode) syscall.Errno {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	d, e := n.dir()
	if e != 0 {
		return e
	}
	if _, ok := d.Entries[name]; ok || n.isVolumes(name) {
		return syscall.EEXIST
	}
	f.setEntryLocked(d, name, c.Ino)
	if c.isDir() {
		d.Nlink++
	}
	d.touch(c.Ctime)
	f.inodes[c.Ino] = c
	f.changedLocked(d, c)
	return 0
}

// newInode allocates an inode number and fills in the common fields.
func (n *node) newInode(ctx context.Context, mode uint32) *inode {
	uid, gid := caller(ctx)
	now := nowNs()
	n.f.mu.Lock()
	ino := n.f.nextIno
	n.f.nextIno++
	n.f.changes++
	n.f.mu.Unlock()
	return &inode{attrs: attrs{Ino: ino, Mode: mode, UID: uid, GID: gid, Nlink: 1, Atime: now, Mtime: now, Ctime: now}}
}

// makeChild adds a new inode of mode under name in n, once set (if not
// nil) filled in what its kind holds, and fills the kernel's entry.
func (n *node) makeChild(ctx context.Context, name string, mode uint32, set func(c *inode), out *fuse.EntryOut) (*gofs.Inode, *inode, syscall.Errno) {
	if e := n.f.writable(); e != 0 {
		return nil, nil, e
	}
	if e := checkName(name); e != 0 {
		return nil, nil, e
	}
	c := n.newInode(ctx, mode)
	if set != nil {
		set(c)
	}
	if e := n.add(name, c); e != 0 {
		return nil, nil, e
	}
	n.f.mu.RLock()
	n.f.fillAttr(c, &out.Attr)
	n.f.mu.RUnlock()
	return n.newChild(ctx, c), c, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	// No volume yet: the file's bytes live in its inode until it
	// outgrows inlineMax (inline.go).
	i, c, e := n.makeChild(ctx, name, syscall.S_IFREG|mode&0o7777, func(c *inode) { c.opens = 1 }, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	return i, newHandle(c), fuse.FOPEN_KEEP_CACHE, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	i, _, e := n.makeChild(ctx, name, syscall.S_IFDIR|mode&0o7777, func(c *inode) {
		c.Nlink, c.Parent, c.Entries = 2, n.ino, map[string]uint64{}
	}, out)
	return i, e
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	i, _, e := n.makeChild(ctx, name, syscall.S_IFLNK|0o777, func(c *inode) {
		c.Target, c.Size = target, uint64(len(target))
	}, out)
	return i, e
}

// Mknod makes a FIFO, a socket, a character or block device, or an
// empty regular file. A special file is an inode and nothing more: the
// kernel runs FIFOs and sockets itself, and the mount is nodev, so a
// device node keeps its number (Rdev) without opening the device.
func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFCHR, syscall.S_IFBLK:
	case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFREG:
		dev = 0
	default:
		return nil, syscall.EINVAL
	}
	i, _, e := n.makeChild(ctx, name, mode&(syscall.S_IFMT|0o7777), func(c *inode) { c.Rdev = dev }, out)
	return i, e
}

var _ gofs.NodeMknoder = (*node)(nil)

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	c := n.f.inodes[n.ino]
	if c == nil || c.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		return nil, syscall.EINVAL
	}
	return []byte(c.Target), 0
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if e := n.f.writable(); e != 0 {
		return nil, e
	}
	if e := checkName(name); e != 0 {
		return nil, e
	}
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV // a volumes/ file
	}
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	d, e := n.dir()
	if e != 0 {
		return nil, e
	}
	c := f.inodes[t.ino]
	switch {
	case c == nil:
		return nil, syscall.ENOENT
	case c.isDir():
		return nil, syscall.EPERM
	case c.Nlink == 0:
		return nil, syscall.ENOENT
	}
	if _, ok := d.Entries[name]; ok || n.isVolumes(name) {
		return nil, syscall.EEXIST
	}
	now := nowNs()
	f.setEntryLocked(d, name, c.Ino)
	d.touch(now)
	c.Nlink++
	c.Ctime = now
	f.changedLocked(d, c)
	n.f.fillAttr(c, &out.Attr)
	return t.EmbeddedInode(), 0
}

// unlinkLocked drops one name of c; it reports whether c is now free.
func (f *FS) unlinkLocked(c *inode, now int64) bool {
	c.Nlink--
	c.Ctime = now
	if c.isDir() {
		c.Nlink = 0
	}
	f.changedLocked(c)
	return c.Nlink == 0 && c.opens == 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := n.f.writable(); e != 0 {
		return e
	}
	f := n.f
	f.mu.Lock()
	d, c, e := n.child(name)
	if e != 0 {
		f.mu.Unlock()
		if e == syscall.ENOENT && n.isVolumes(name) {
			return syscall.EISDIR
		}
		return e
	}
	if c.isDir() {
		f.mu.Unlock()
		return syscall.EISDIR
	}
	now := nowNs()
	f.setEntryLocked(d, name, 0)
	d.touch(now)
	f.changedLocked(d)
	free := f.unlinkLocked(c, now)
	f.mu.Unlock()
	if free {
		f.release(ctx, c)
	}
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := n.f.writable(); e != 0 {
		return e
	}
	if n.isVolumes(name) {
		return syscall.EBUSY
	}
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	d, c, e := n.child(name)
	switch {
	case e != 0:
		return e
	case !c.isDir():
		return syscall.ENOTDIR
	case len(c.Entries) > 0:
		return syscall.ENOTEMPTY
	}
	now := nowNs()
	f.setEntryLocked(d, name, 0)
	d.Nlink--
	d.touch(now)
	f.changedLocked(d)
	f.unlinkLocked(c, now)
	delete(f.inodes, c.Ino)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := n.f.writable(); e != 0 {
		return e
	}
	if e := checkName(newName); e != 0 {
		return e
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 || flags == unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE {
		return syscall.EINVAL
	}
	if n.isVolumes(name) || np.isVolumes(newName) {
		return syscall.EBUSY
	}
	f := n.f
	f.mu.Lock()
	src, e := n.dir()
	if e != 0 {
		f.mu.Unlock()
		return e
	}
	dst, e := np.dir()
	if e != 0 {
		f.mu.Unlock()
		return e
	}
	c := f.inodes[src.Entries[name]]
	if c == nil {
		f.mu.Unlock()
		return syscall.ENOENT
	}
	old := f.inodes[dst.Entries[newName]]
	if old == c {
		f.mu.Unlock()
		return 0 // two names of one file, or a name onto itself
	}
	// A directory may not move below itself.
	for _, moved := range []*inode{c, old} {
		if moved == nil || !moved.isDir() || (moved == old && flags&unix.RENAME_EXCHANGE == 0) {
			continue
		}
		to := dst
		if moved == old {
			to = src
		}
		for p := to; ; p = f.inodes[p.Parent] {
			if p.Ino == moved.Ino {
				f.mu.Unlock()
				return syscall.EINVAL
			}
			if p.Ino == rootIno {
				break
			}
		}
	}
	now := nowNs()
	var free *inode
	switch {
	case flags&unix.RENAME_EXCHANGE != 0:
		if old == nil {
			f.mu.Unlock()
			return syscall.ENOENT
		}
		f.setEntryLocked(src, name, old.Ino)
		f.setEntryLocked(dst, newName, c.Ino)
		if c.isDir() != old.isDir() {
			if c.isDir() {
				src.Nlink--
				dst.Nlink++
			} else {
				src.Nlink++
				dst.Nlink--
			}
		}
		if old.isDir() {
			old.Parent = src.Ino
		}
		old.Ctime = now
	case old != nil && flags&unix.RENAME_NOREPLACE != 0:
		f.mu.Unlock()
		return syscall.EEXIST
	case old != nil && c.isDir() && !old.isDir():
		f.mu.Unlock()
		return syscall.ENOTDIR
	case old != nil && !c.isDir() && old.isDir():
		f.mu.Unlock()
		return syscall.EISDIR
	case old != nil && old.isDir() && len(old.Entries) > 0:
		f.mu.Unlock()
		return syscall.ENOTEMPTY
	default:
		if old != nil {
			if old.isDir() {
				dst.Nlink--
				delete(f.inodes, old.Ino)
			}
			if f.unlinkLocked(old, now) && old.isReg() {
				free = old
			}
		}
		f.setEntryLocked(src, name, 0)
		f.setEntryLocked(dst, newName, c.Ino)
		if c.isDir() {
			src.Nlink--
			dst.Nlink++
		}
	}
	if c.isDir() {
		c.Parent = dst.Ino
	}
	c.Ctime = now
	src.touch(now)
	dst.touch(now)
	f.changedLocked(src, dst, c)
	if old != nil {
		f.changedLocked(old)
	}
	moved := c.isDir() && src != dst
	movedBack := old != nil && old.isDir() && src != dst && flags&unix.RENAME_EXCHANGE != 0
	f.mu.Unlock()
	// A directory that changed parents lists a new "..": drop the listing
	// the kernel may hold (see OpendirHandle; the host's own, dirListing,
	// checks the parent). go-fuse moves its children after this returns,
	// so they are still under their old names here.
	if moved {
		invalidate(n.GetChild(name))
	}
	if movedBack {
		invalidate(np.GetChild(newName))
	}
	if free != nil {
		f.release(ctx, free)
	}
	return 0
}

// invalidate drops what the kernel caches of i's content (a directory's
// listing); nil (an inode the kernel does not hold) has nothing cached.
func invalidate(i *gofs.Inode) {
	if i != nil {
		i.NotifyContent(0, 0)
	}
}

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
	f.mu.Unlock()
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
	// No read-ahead hint for a stream's read: ReadStream reads its runs
	// from the node itself, and pages the agent prefetched for the next
	// ones cost a copy into the Loading Zone and one out of it
	// (docs/decisions.md, 18).
	if n.f.cfg.OnRead != nil && len(dest) < streamRead {
		first := uint64(off) / pageid.Size
		last := (uint64(off) + uint64(len(dest)) - 1) / pageid.Size
		n.f.cfg.OnRead(pageid.MakeKey(vol, first), int(last-first+1), (size+pageid.Size-1)/pageid.Size)
	}
	var err error
	if len(dest) >= streamRead {
		if h, ok := fh.(*handle); ok {
			if res, ok := n.f.ra.take(ctx, c, &h.stream, vol, uint64(off), len(dest), size); ok {
				c.io.RUnlock()
				return res, 0
			}
		}
		err = n.f.cfg.Store.ReadStream(ctx, vol, uint64(off), dest)
	} else {
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
		n.f.mu.Unlock()
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
	n.f.mu.Unlock()
	return 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	f := n.f
	capacity := f.cfg.Capacity
	if capacity == 0 {
		capacity = 1 << 50
	}
	f.refreshStored(ctx)
	_, used := f.storedOf(0)
	f.mu.RLock()
	files := uint64(len(f.inodes))
	f.mu.RUnlock()
	out.Bsize, out.Frsize, out.NameLen = pageid.Size, pageid.Size, maxName
	out.Blocks = capacity / pageid.Size
	out.Bfree = (capacity - min(used, capacity)) / pageid.Size
	out.Bavail = out.Bfree
	// Files past a page take a memory-node volume each (16-bit ids);
	// smaller ones are bounded only by the host's memory.
	out.Files = 1 << 16
	out.Ffree = out.Files - min(files, out.Files)
	return 0
}

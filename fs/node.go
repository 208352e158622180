package fs

import (
	"context"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/pageid"
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
	f.unlockFollowing(c)
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

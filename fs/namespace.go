package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A directory's operations on its entries: create, mkdir, symlink, mknod,
// link, unlink, rmdir and rename.

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

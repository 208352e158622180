package fs

import (
	"context"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// Extended attributes live in the inode and are saved with the metadata.
const maxXattrValue = 64 << 10

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	c := n.f.inodes[n.ino]
	if c == nil {
		return 0, syscall.ENOENT
	}
	v, ok := c.Xattr[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if e := n.f.writable(); e != 0 {
		return e
	}
	if len(attr) > 255 || attr == "" {
		return syscall.ERANGE
	}
	if len(data) > maxXattrValue {
		return syscall.E2BIG
	}
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	c := n.f.inodes[n.ino]
	if c == nil {
		return syscall.ENOENT
	}
	_, exists := c.Xattr[attr]
	switch {
	case flags&unix.XATTR_CREATE != 0 && exists:
		return syscall.EEXIST
	case flags&unix.XATTR_REPLACE != 0 && !exists:
		return syscall.ENODATA
	}
	if c.Xattr == nil {
		c.Xattr = map[string][]byte{}
	}
	c.Xattr[attr] = append([]byte(nil), data...)
	c.Ctime = nowNs()
	n.f.changedLocked(c)
	return 0
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if e := n.f.writable(); e != 0 {
		return e
	}
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	c := n.f.inodes[n.ino]
	if c == nil {
		return syscall.ENOENT
	}
	if _, ok := c.Xattr[attr]; !ok {
		return syscall.ENODATA
	}
	delete(c.Xattr, attr)
	c.Ctime = nowNs()
	n.f.changedLocked(c)
	return 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.f.mu.RLock()
	defer n.f.mu.RUnlock()
	c := n.f.inodes[n.ino]
	if c == nil {
		return 0, syscall.ENOENT
	}
	names := make([]string, 0, len(c.Xattr))
	size := 0
	for k := range c.Xattr {
		names = append(names, k)
		size += len(k) + 1
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	sort.Strings(names)
	at := 0
	for _, k := range names {
		at += copy(dest[at:], k)
		dest[at] = 0
		at++
	}
	return uint32(size), 0
}

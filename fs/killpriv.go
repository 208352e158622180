package fs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The mount takes over clearing set-user-ID and set-group-ID bits from
// the kernel (FUSE_HANDLE_KILLPRIV_V2, MountOptions). Without it the
// kernel asked the mount for a file's security.capability attribute
// before every write(2) (a GETXATTR round trip each, the largest part of
// a small buffered write: docs/decisions.md, 17); with it the kernel asks
// once per inode and remembers the answer (S_NOSEC) until the inode's
// attributes are next refreshed or a security attribute is set. In
// exchange the kernel tells the mount when a write, truncation or
// O_TRUNC open by a caller without CAP_FSETID, or a chown, must clear
// the bits, and the mount clears them. File capabilities are still removed by
// the kernel (it asks, as before, whenever the answer may have changed).

// killSuidgid is mode after a write or truncation by a caller without
// CAP_FSETID, or after a chown, once the kernel asks: set-user-ID goes;
// set-group-ID goes with group execute, or (without it, when the bit
// once meant mandatory locking) when the caller is outside the file's
// group and not root, as the kernel decides for a local filesystem. The
// mount sees only the caller's uid and primary group, so a member by a
// supplementary group loses the bit too: the safe side.
func killSuidgid(mode uint32, outsider bool) uint32 {
	mode &^= syscall.S_ISUID
	if mode&syscall.S_IXGRP != 0 || outsider {
		mode &^= syscall.S_ISGID
	}
	return mode
}

// killOnly is a SETATTR that only asks for the bits to be cleared: the
// mount's own, for a WRITE that carried the kernel's request.
const killOnly = fuse.FATTR_KILL_SUIDGID

// Writev clears the bits first when the kernel says the writer lacks
// CAP_FSETID, as a local filesystem does before it copies the data.
func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if st := r.killAsked(cancel, in); !st.Ok() {
		return 0, st
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// Write is Writev for a server that would call it.
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if st := r.killAsked(cancel, in); !st.Ok() {
		return 0, st
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

// killAsked clears the bits if the WRITE carries the kernel's request.
// An OPEN's request (O_TRUNC) needs no handling of its own: without
// ATOMIC_O_TRUNC the kernel truncates with a SETATTR that carries it too.
func (r *rawFS) killAsked(cancel <-chan struct{}, in *fuse.WriteIn) fuse.Status {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID == 0 {
		return fuse.OK
	}
	return r.kill(cancel, &in.InHeader)
}

// GetXAttr counts the requests, for the test that the kernel stops
// asking for security.capability before every write.
func (r *rawFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	r.getxattrs.Add(1)
	return r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
}

// kill clears the bits of h's inode through the node bridge, as a
// SETATTR with only FATTR_KILL_SUIDGID (node.Setattr).
func (r *rawFS) kill(cancel <-chan struct{}, h *fuse.InHeader) fuse.Status {
	var out fuse.AttrOut
	return r.RawFileSystem.SetAttr(cancel, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: *h, Valid: killOnly}}, &out)
}

// outsider says whether the caller of a request is neither root nor in
// c's group (by its primary group: all the request tells), f.mu held.
func outsider(ctx context.Context, c *inode) bool {
	uid, gid := caller(ctx)
	return uid != 0 && gid != c.GID
}

package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/pageid"
	"golang.org/x/sys/unix"
)

// The volumes directory shows each NBD volume as a file of its size. Its
// files are opened with direct I/O: the kernel keeps no page cache for
// them, so a write over NBD is never hidden by stale kernel pages; both
// paths share the page store, which is the one cache.

type volumesDir struct {
	gofs.Inode
	f *FS
}

type volumeFile struct {
	gofs.Inode
	f *FS
	v pageid.VolumeInfo
}

func (n *node) volumesDir(ctx context.Context, out *fuse.EntryOut) *gofs.Inode {
	out.Attr = volumesAttr()
	return n.NewInode(ctx, &volumesDir{f: n.f}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: volumesIno})
}

func volumesAttr() fuse.Attr {
	return fuse.Attr{Ino: volumesIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Blksize: pageid.Size}
}

func (d *volumesDir) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Attr = volumesAttr()
	return 0
}

func (d *volumesDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.f.refreshStored(ctx)
	for _, v := range d.f.vols {
		if v.Name == name {
			out.Attr = d.f.volumeAttr(v)
			return d.NewInode(ctx, &volumeFile{f: d.f, v: v}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: volumeInoBase + uint64(v.ID)}), 0
		}
	}
	return nil, syscall.ENOENT
}

// OpendirHandle: the volumes in cookie order, as every directory (dirs.go).
func (d *volumesDir) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{list: d.listing}, 0, 0
}

func (d *volumesDir) listing() ([]fuse.DirEntry, syscall.Errno) {
	ents := dots(volumesIno, rootIno, len(d.f.vols))
	for _, v := range d.f.vols {
		ents = append(ents, fuse.DirEntry{Name: v.Name, Ino: volumeInoBase + uint64(v.ID), Mode: syscall.S_IFREG})
	}
	cookieOrder(d.f.seed, ents[2:])
	return ents, 0
}

// The volumes directory is read-only as a directory: volumes are created
// with `pd3 up/serve --volume`, not here.

func (d *volumesDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}

func (d *volumesDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *volumesDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *volumesDir) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (d *volumesDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

// volumeAttr is the attributes of volume v's file; the caller refreshes
// what is stored.
func (f *FS) volumeAttr(v pageid.VolumeInfo) fuse.Attr {
	stored, _ := f.storedOf(v.ID)
	return fuse.Attr{
		Ino: volumeInoBase + uint64(v.ID), Mode: syscall.S_IFREG | 0o600, Nlink: 1,
		Size: v.Size, Blocks: stored / 512, Blksize: pageid.Size,
	}
}

func (v *volumeFile) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	v.f.refreshStored(ctx)
	out.Attr = v.f.volumeAttr(v.v)
	return 0
}

// Setattr accepts only what leaves a volume as it is: its size is fixed.
func (v *volumeFile) Setattr(ctx context.Context, _ gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok && size != v.v.Size {
		return syscall.EPERM
	}
	out.Attr = v.f.volumeAttr(v.v)
	return 0
}

// Lseek leaves SEEK_DATA and SEEK_HOLE to the kernel, as for files
// (node.Lseek): the first LSEEK of the mount decides for all of them.
func (v *volumeFile) Lseek(ctx context.Context, _ gofs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	return 0, syscall.ENOSYS
}

func (v *volumeFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EPERM
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (v *volumeFile) Read(ctx context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	ctx = uninterrupted(ctx)
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if uint64(off) >= v.v.Size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(uint64(len(dest)), v.v.Size-uint64(off))]
	if err := v.f.cfg.Store.ReadRange(ctx, v.v.ID, uint64(off), dest); err != nil {
		return nil, v.f.errno("read", err)
	}
	return fuse.ReadResultData(dest), 0
}

func (v *volumeFile) Write(ctx context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	ctx = uninterrupted(ctx)
	if off < 0 || uint64(off)+uint64(len(data)) > v.v.Size {
		return 0, syscall.ENOSPC // a block device's answer to writing past its end
	}
	if err := v.f.cfg.Store.WriteRange(ctx, v.v.ID, uint64(off), data); err != nil {
		return 0, v.f.errno("write", err)
	}
	return uint32(len(data)), 0
}

func (v *volumeFile) Fsync(ctx context.Context, _ gofs.FileHandle, flags uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	return v.f.errno("fsync", v.f.cfg.Store.FlushVolume(ctx, v.v.ID))
}

func (v *volumeFile) Allocate(ctx context.Context, _ gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) == 0 {
		return 0
	}
	if off >= v.v.Size {
		return 0
	}
	size = min(size, v.v.Size-off)
	return v.f.errno("fallocate", v.f.cfg.Store.ZeroRange(ctx, v.v.ID, off, size, false))
}

package bench

import (
	"context"
	"fmt"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/nbdclient"
)

// ServeFUSERelay mounts at dir a filesystem of one file, "bench", whose
// bytes are the NBD export at addr: every READ and WRITE is one NBD
// request there, sent and answered on the goroutine that serves the FUSE
// request, and nothing else is done. It is the ceiling of a Go FUSE
// server that reaches its data one loopback hop away (the shape of a pd3
// miss, without a cache, a lookup or an agent): "go-fuse-nbdkit" in
// `pd3 bench fuse`. The mount takes pd3's kernel options
// (fs.MountOptions).
// mounted is called once the mount is up. It returns when ctx ends,
// unmounting.
func ServeFUSERelay(ctx context.Context, dir, addr string, conns int, mounted func()) error {
	pool := make(chan *nbdclient.Client, conns)
	var size uint64
	for range conns {
		c, err := nbdclient.Dial(addr, "")
		if err != nil {
			close(pool)
			for c := range pool {
				c.Close()
			}
			return err
		}
		size = c.Size
		pool <- c
	}
	defer func() {
		close(pool)
		for c := range pool {
			c.Close()
		}
	}()
	root := &relayDir{file: &relayFile{pool: pool, size: size}}
	srv, err := gofs.Mount(dir, root, &gofs.Options{MountOptions: fs.MountOptions("go-fuse-relay")})
	if err != nil {
		return fmt.Errorf("mounting the relay at %s: %w", dir, err)
	}
	// Read ahead as far as pd3's mount does.
	if _, err := fs.SetKernelReadAhead(dir); err != nil {
		srv.Unmount()
		return err
	}
	mounted()
	go func() {
		<-ctx.Done()
		srv.Unmount()
	}()
	srv.Wait()
	return nil
}

type relayDir struct {
	gofs.Inode
	file *relayFile
}

var _ gofs.NodeOnAdder = (*relayDir)(nil)

func (d *relayDir) OnAdd(ctx context.Context) {
	d.AddChild("bench", d.NewPersistentInode(ctx, d.file, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: 2}), false)
}

// relayFile is the export as a file; each request borrows a connection.
type relayFile struct {
	gofs.Inode
	pool chan *nbdclient.Client
	size uint64
}

var (
	_ gofs.NodeOpener    = (*relayFile)(nil)
	_ gofs.NodeReader    = (*relayFile)(nil)
	_ gofs.NodeWriter    = (*relayFile)(nil)
	_ gofs.NodeGetattrer = (*relayFile)(nil)
	_ gofs.NodeSetattrer = (*relayFile)(nil)
	_ gofs.NodeFsyncer   = (*relayFile)(nil)
)

func (f *relayFile) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (f *relayFile) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size, out.Nlink = syscall.S_IFREG|0o644, f.size, 1
	return 0
}

// Setattr accepts and ignores what fio asks (the size is the export's).
func (f *relayFile) Setattr(ctx context.Context, fh gofs.FileHandle, _ *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.Getattr(ctx, fh, out)
}

func (f *relayFile) Read(_ context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 || uint64(off) >= f.size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(uint64(len(dest)), f.size-uint64(off))]
	c := <-f.pool
	err := c.Read(uint64(off), dest)
	f.pool <- c
	if err != nil {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest), 0
}

func (f *relayFile) Write(_ context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if off < 0 || uint64(off)+uint64(len(data)) > f.size {
		return 0, syscall.ENOSPC
	}
	c := <-f.pool
	err := c.Write(uint64(off), data)
	f.pool <- c
	if err != nil {
		return 0, syscall.EIO
	}
	return uint32(len(data)), 0
}

func (f *relayFile) Fsync(context.Context, gofs.FileHandle, uint32) syscall.Errno {
	c := <-f.pool
	err := c.Flush()
	f.pool <- c
	if err != nil {
		return syscall.EIO
	}
	return 0
}

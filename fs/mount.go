package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/pd3-go/pd3/hostview/pagecache"
)

// ErrNoFUSE means this machine cannot mount: no usable /dev/fuse, or (not
// root) no fusermount3.
var ErrNoFUSE = errors.New("FUSE is not available")

// Available reports why FUSE cannot be used here, or nil.
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: /dev/fuse: %v (load the fuse module, or give the container the device)", ErrNoFUSE, err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			if _, err2 := exec.LookPath("fusermount"); err2 != nil {
				return fmt.Errorf("%w: no fusermount3 (apt-get install fuse3)", ErrNoFUSE)
			}
		}
	}
	return nil
}

// Mounted is a filesystem mounted at Dir.
type Mounted struct {
	FS     *FS
	Dir    string
	Server *fuse.Server
	// Dev is the mount's device number as the kernel's tracepoints print
	// it (MAJOR<<20 | MINOR), for the page-cache tracker.
	Dev uint32

	raw *rawFS
}

// maxIO is the largest READ and WRITE the kernel sends (max_read,
// MaxWrite and so max_pages).
const maxIO = 1 << 20

// attrTimeout is how long the kernel keeps entries, attributes and
// negative entries. Every change of the tree comes through this mount's
// kernel, which updates what it cached itself, so a long one is safe;
// what it cannot see is st_blocks (fsync drops the attributes so the
// next stat asks). 1 s (libfuse's) cost dbench a quarter of its speed.
const attrTimeout = 30 * time.Second

// MountOptions are the kernel options of a pd3 mount called fsName; the
// benchmark's FUSE ceiling (go-fuse-nbdkit) mounts with them too, so that
// it measures the path pd3's READs take.
func MountOptions(fsName string) fuse.MountOptions {
	return fuse.MountOptions{
		FsName:  fsName,
		Name:    DefaultName,
		Options: []string{"default_permissions"},
		// Root mounts with mount(2) itself, so tests and servers
		// need no setuid helper.
		DirectMount: os.Geteuid() == 0,
		MaxWrite:    maxIO,
		// Our read results are bytes in memory: splice costs a pipe
		// and two more syscalls per READ (11% of host CPU on 4 KiB
		// random reads) for nothing.
		DisableSplice: true,
		// Without ASYNC_DIO the kernel sends an O_DIRECT reader's
		// requests one at a time, so queue depth (libaio Q16) buys
		// nothing; with it they are background requests, up to
		// MaxBackground in flight.
		// The kernel's writeback cache: buffered writes land in
		// the page cache and reach us in large WRITEs when the
		// kernel writes back (an fsync, memory pressure, its
		// timer), not one synchronous WRITE per write(2)
		// (docs/decisions.md, 16). fsync
		// is the durability barrier either way.
		// HANDLE_KILLPRIV_V2: the mount clears set-user-ID and
		// set-group-ID bits itself, and the kernel stops asking
		// for security.capability before every write(2)
		// (killpriv.go): 4 KiB buffered writes 2.4x faster.
		ExtraCapabilities: fuse.CAP_ASYNC_DIO | fuse.CAP_WRITEBACK_CACHE | fuse.CAP_HANDLE_KILLPRIV_V2,
		MaxBackground:     64,
		AllowOther:        os.Geteuid() == 0,
	}
}

// Mount mounts f at dir.
func Mount(f *FS, dir string) (*Mounted, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	timeout := attrTimeout
	opts := &gofs.Options{
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		RootStableAttr:  &gofs.StableAttr{Ino: rootIno},
		MountOptions:    MountOptions("pd3:" + f.cfg.Name),
	}
	raw := &rawFS{RawFileSystem: gofs.NewNodeFS(&node{f: f, ino: rootIno}, opts)}
	served := &servedFS{RawFileSystem: raw, busy: f.cfg.Busy, procs: f.cfg.Procs}
	srv, err := fuse.NewServer(served, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("fs: mounting at %s: %w", dir, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, fmt.Errorf("fs: mounting at %s: %w", dir, err)
	}
	dev, err := pagecache.DevOf(dir)
	if err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("fs: %w", err)
	}
	if was, err := SetKernelReadAhead(dir); err != nil {
		// Not root: the mount works, its sequential readers wait more.
		f.cfg.Log.Info("fs: the kernel's read-ahead of the mount stays as it is", "mount", dir, "read_ahead_bytes", was, "err", err)
	}
	return &Mounted{FS: f, Dir: dir, Server: srv, Dev: dev, raw: raw}, nil
}

// Unmount detaches the mount, lazily if it stays busy (an open file or a
// shell inside it), waits for the server to stop and then closes the
// filesystem, writing everything back.
func (m *Mounted) Unmount(ctx context.Context) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = m.Server.Unmount(); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		// Busy: detach it from the tree; the kernel keeps the connection
		// until its last user goes, so write everything back now.
		if err2 := detach(m.Dir); err2 != nil {
			return fmt.Errorf("fs: unmounting %s: %v; lazily: %w", m.Dir, err, err2)
		}
		if err := m.FS.Sync(ctx); err != nil {
			return err
		}
	}
	done := make(chan struct{})
	go func() { m.Server.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("fs: %s is detached but still in use: %w", m.Dir, ctx.Err())
	}
	return m.FS.Close(ctx)
}

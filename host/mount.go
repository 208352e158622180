package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/hostview/pagecache"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/pageid"
)

// mount opens the filesystem and mounts it; the directory is created if
// missing.
func (h *Host) mount(ctx context.Context, cfg Config) error {
	if err := fs.Available(); err != nil {
		return fmt.Errorf("host: --mount %s: %w", cfg.Mount, err)
	}
	stale, err := fs.PrepareMountPoint(cfg.Mount)
	if err != nil {
		return fmt.Errorf("host: --mount %s: %w", cfg.Mount, err)
	}
	if stale {
		cfg.Log.Warn(fmt.Sprintf("detached a dead pd3 mount at %s, left by a pd3 that ended without unmounting", cfg.Mount))
	}
	if n := fs.Hides(cfg.Mount); n > 0 {
		cfg.Log.Warn(fmt.Sprintf("%s is not empty: the mount hides its %s until pd3 stops (mount on an empty directory to avoid this)", cfg.Mount, units.Count(n, "entry", "entries")))
	}
	fcfg := fs.Config{Name: cfg.FSName, Store: h.Store, Volumes: h.Volumes, LeaseTTL: cfg.FSLease, Log: cfg.Log, Busy: h.busy, Procs: h.procs}
	if h.Client != nil {
		fcfg.Backend = h.Client
	}
	// The FUSE request mirror and the tracker's events go to the agent:
	// in this process, or as messages to an agent process.
	var readAhead func(src int, first pageid.Key, n int, end uint64)
	switch {
	case h.Agent != nil:
		readAhead, fcfg.OnWrite = h.Agent.ReadAhead, h.Agent.Written
	case h.Link != nil:
		readAhead, fcfg.OnWrite = h.Link.ReadAhead, h.Link.Written
	}
	if readAhead != nil {
		fcfg.OnRead = func(first pageid.Key, n int, end uint64) { readAhead(dpu.SourceFUSE, first, n, end) }
	}
	if h.control != nil {
		if err := h.holdFS(ctx, cfg, &fcfg); err != nil {
			return err
		}
	}
	if h.Replicated != nil {
		g, err := h.openGroup(ctx, cfg)
		if err != nil {
			return fmt.Errorf("host: fs %q: %w", cfg.FSName, err)
		}
		h.group, fcfg.Backend = g, g
	}
	f, err := fs.Open(ctx, fcfg)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if h.control != nil {
		h.heldFS.Store(f)
		select {
		case <-h.control.Lost(): // lost while opening: the watcher may have looked already
			f.Fence()
		default:
		}
	}
	m, err := fs.Mount(f, cfg.Mount)
	if err != nil {
		f.Close(ctx)
		return fmt.Errorf("host: %w", err)
	}
	h.FS, h.Mounted = f, m
	if readAhead == nil {
		h.TrackerErr = errors.New("no DPU agent to feed")
		return nil
	}
	// A file the mount reads ahead itself (fs: stream read-ahead) is not
	// the agent's to prefetch: it would fetch every page twice, and copy
	// it into the Loading Zone for nothing.
	// Its page-cache events are muted in the kernel while it is read
	// ahead (docs/decisions.md, 37).
	view := &pagecache.View{KeyOf: f.KeyOf, Quiet: f.ReadingAhead, OnRead: func(first pageid.Key, n int) {
		if !f.ReadingAhead(first) {
			readAhead(dpu.SourceKernel, first, n, f.EndOf(first))
		}
	}}
	var kv *hostview.Set
	if h.Agent != nil {
		pages := cfg.KernelViewPages
		if pages <= 0 {
			pages = 1 << 20
		}
		kv = hostview.New(pages, 2)
		view.Set = kv
	} else {
		view.OnRange = h.Link.KernelRange
	}
	// Only files of fs.FollowFrom bytes or more: a tree of small files
	// would cost more to follow than the agent saves (docs/decisions.md,
	// 44).
	tr, err := pagecache.StartFollowing(m.Dev, view)
	if err != nil {
		h.TrackerErr = err
		return nil
	}
	f.SetFollower(tr)
	if kv != nil {
		h.Agent.SetKernelView(kv)
	}
	h.Tracker, h.KernelView = tr, view
	return nil
}

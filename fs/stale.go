package fs

import (
	"context"
	"time"
)

// A crashed mount may have written pages of a file back past the size it
// last saved: eviction and fsync write data, the size follows with the
// next metadata sync. The next mount loads the older size, and the bytes
// past it are still at the memory node. Nothing reads them while they lie
// past the size, but a truncation that grows the file, a write past its
// end (the hole before it) or fallocate would make them part of it,
// where zeroes belong. So Open marks every file loaded after a mount that
// did not end with Close (the clean mark, meta.go) stale from its size,
// and the first operation of the run that reaches past that size zeroes
// everything from there to the end of the file's volume first — once per
// file and run, at the cost of a trim of the volume's tail (a pass over
// the host cache's frames, one TRIM per GiB of volume in flight at once).
// A mount that follows a clean one pays nothing.

// markStale records that c's bytes from size on may be a crashed mount's.
func (c *inode) markStale(size uint64) { c.stale.Store(size + 1) }

// unstale zeroes c's stale tail before an operation that makes the bytes
// up to end part of the file (vol is c's volume). It returns at once for
// a file with no stale tail, or one the operation does not reach.
func (f *FS) unstale(ctx context.Context, c *inode, vol uint16, end uint64) error {
	if s := c.stale.Load(); s == 0 || end < s {
		return nil
	}
	c.staleMu.Lock()
	defer c.staleMu.Unlock()
	s := c.stale.Load()
	if s == 0 || end < s {
		return nil // zeroed by an operation that waited here before this one
	}
	from := s - 1
	start := time.Now()
	if err := f.cfg.Store.ZeroRange(ctx, vol, from, MaxFileSize-from, false); err != nil {
		return err
	}
	c.stale.Store(0)
	f.unstaled.Add(1)
	f.cfg.Log.Info("fs: zeroed what a crashed mount may have left past a file's size",
		"inode", c.Ino, "size", from, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

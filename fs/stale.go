package fs

import (
	"context"
	"time"
)

// A file's bytes past its size must read as zeroes once an operation makes
// them part of the file: a truncation that grows it, a write past its end
// (the hole before it) or fallocate. Two things can leave other bytes
// there, out of sight while they lie past the size:
//
//   - A crashed mount may have written pages back past the size it last
//     saved: eviction and fsync write data, the size follows with the next
//     metadata sync. The next mount loads the older size, and the bytes
//     past it are still at the memory node. So Open marks every file
//     loaded after a mount that did not end with Close (the clean mark,
//     meta.go) stale from its size. A mount that follows a clean one pays
//     nothing.
//   - A write of this run that fails past the size may have cached some of
//     its pages before it failed (the cache full of pages it cannot write
//     back, say). Write marks the file stale from where that write began
//     past the size.
//
// The first operation that reaches past the mark zeroes from there (or
// from the size, if that is further) to the end of the file's volume, at
// the cost of a trim of the volume's tail (a pass over the host cache's
// frames, one TRIM per GiB of volume in flight at once). It does so under
// the file's exclusive I/O lock: every write that succeeded has then moved
// the size past what it wrote, so nothing acknowledged lies past the size,
// where a write still in flight under the shared lock might.

// markStale records that c's bytes from byte from on may not be zeroes
// where they lie past the size. A lower mark already set stays.
func (c *inode) markStale(from uint64) {
	for {
		old := c.stale.Load()
		if old != 0 && old <= from+1 {
			return
		}
		if c.stale.CompareAndSwap(old, from+1) {
			return
		}
	}
}

// staleBefore reports whether an operation that makes the bytes up to end
// part of the file must zero c's stale tail first.
func (c *inode) staleBefore(end uint64) bool {
	s := c.stale.Load()
	return s != 0 && end >= s
}

// unstale zeroes c's stale tail before an operation that makes the bytes
// up to end part of the file (vol is c's volume); c.io is held
// exclusively. It returns at once for a file with no stale tail, or one
// the operation does not reach.
func (f *FS) unstale(ctx context.Context, c *inode, vol uint16, end uint64) error {
	s := c.stale.Load()
	if s == 0 || end < s {
		return nil
	}
	f.mu.RLock()
	from := max(s-1, c.Size)
	f.mu.RUnlock()
	start := time.Now()
	if err := f.cfg.Store.ZeroRange(ctx, vol, from, MaxFileSize-from, false); err != nil {
		return err
	}
	c.stale.Store(0) // no write runs to mark it again while c.io is held
	f.unstaled.Add(1)
	f.cfg.Log.Info("fs: zeroed what a crashed mount or a failed write may have left past a file's size",
		"inode", c.Ino, "from", from, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// unstaleShared is unstale for a caller that holds c.io shared, which it
// holds again on return: the zeroing waits for the writes in flight.
func (f *FS) unstaleShared(ctx context.Context, c *inode, vol uint16, end uint64) error {
	for c.staleBefore(end) {
		c.io.RUnlock()
		c.io.Lock()
		err := f.unstale(ctx, c, vol, end)
		c.io.Unlock()
		c.io.RLock()
		if err != nil {
			return err
		}
	}
	return nil
}

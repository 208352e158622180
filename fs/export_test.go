package fs

import "context"

// PoolSize is how many file volumes a mount makes ahead, for tests.
const PoolSize = poolSize

// Compact folds the metadata journal into a new snapshot now.
func (f *FS) Compact(ctx context.Context) error { return f.syncMeta(ctx, true) }

// VolumeOf is the name of file ino's data volume ("" while inline).
func (f *FS) VolumeOf(ino uint64) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n := f.inodes[ino]; n != nil {
		return n.Vol
	}
	return ""
}

// ReadAhead is what the mount's stream read-ahead did: reads answered
// from a window, windows dropped unread, and windows held now.
func (f *FS) ReadAhead() (hits, discards uint64, held int32) {
	return f.ra.Hits.Load(), f.ra.Discards.Load(), f.ra.used.Load()
}

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

// Opendirs is how many OPENDIRs the kernel sent m, and whether it opens
// directories itself after the first (FUSE_NO_OPENDIR_SUPPORT).
func Opendirs(m *Mounted) (n uint64, kernelOpens bool) {
	return m.raw.opendirs.Load(), m.raw.noOpendir
}

// Getxattrs is how many GETXATTRs the kernel sent m.
func Getxattrs(m *Mounted) uint64 { return m.raw.getxattrs.Load() }

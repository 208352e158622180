package fs

import "context"

// PoolSize is how many file volumes a mount makes ahead, for tests.
const PoolSize = poolSize

// Compact folds the metadata journal into a new snapshot now.
func (f *FS) Compact(ctx context.Context) error { return f.syncMeta(ctx, true) }

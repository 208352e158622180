package fs

// PoolReady is how many made-ahead file volumes f holds, for tests.
func PoolReady(f *FS) int { return len(f.pool.ready) }

// PoolSize is how many it makes ahead.
const PoolSize = poolSize

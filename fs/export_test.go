package fs

// PoolSize is how many file volumes a mount makes ahead, for tests.
const PoolSize = poolSize

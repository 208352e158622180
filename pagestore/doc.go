// Package pagestore is the host's view of volumes of 4 KiB pages: a bounded,
// concurrent, write-back cache in front of a Remote (the memory node, or
// later the DPU agent's rings). Page ids are pageid.Key values: volume (16
// bits) | page number (48 bits).
//
// # Miss path
//
// Get looks in the cache, then in the Loading Zone (Options.Prefetched, set
// when a DPU agent prefetches for this host), then reads the Remote.
// Concurrent readers of the same missing page wait for one remote read: the
// first reader publishes a write-locked frame for the key before reading,
// and the others block on that frame's lock.
//
// GetAsync is the same miss path for a caller that must not block (a
// connection reader running requests to completion): it serves hits at
// once, and for misses (up to MaxAsyncPages pages a call) takes free or
// clean frames, publishes them and starts one AsyncPagesReader read per
// run of missing pages (an AsyncReader read per page from a remote that
// reads one at a time), whose completion, on the remote's reader
// goroutine, makes the frame valid and unlocks it — a lock released by
// another goroutine than the one that took it, which sync.RWMutex allows.
// Whenever it would have to wait it does nothing and says ErrWouldBlock.
// Its loads hold at most a quarter of the frames. PutNow is its write
// path: a cached page no one holds, or a free or clean frame, takes the
// write at once. With more than three quarters of the frames dirty both
// take free frames only, since a search for a clean page among dirty ones
// would scan the cache under the eviction lock; below that, the search
// gives up after cleanTries frames it could not claim.
//
// ReadStream serves large reads without caching them: cached pages are
// copied from the cache, prefetched ones taken from the Loading Zone,
// and the rest read from the Remote straight into the caller's buffer.
// ReadAhead reads a predicted stream's next pages the same way into
// windows of the store's own, which the stream reads that follow copy
// from, and so does a miss of any smaller read, once the window has been
// read (docs/decisions.md, 41); any write, zeroing or removal of a page
// drops the windows that hold it (docs/decisions.md, 33).
//
// # Writes and durability
//
// Put stores a whole page in the cache and marks it dirty; it reaches the
// Remote when it is evicted or when Flush runs. Flush returns once every
// page dirty at its start is at the Remote, and Flushes run one at a time.
// A round copies and writes one batch of 64 pages at a time under a lock
// that it frees between batches, so FlushVolume (a file's fsync) waits for
// one batch of a round, not the whole round, and no two write-backs of one
// page by flushes are ever in flight together. A round finds the dirty
// frames in a bitmap of dirty bits, so an fsync that finds one
// dirty page costs the same in a cache of 64 MiB or 64 GiB.
// A dirty page whose write-back fails stays in the cache (it is the only
// copy of an acknowledged write) and the miss that needed its frame fails.
// StartWriteback runs Flush rounds in the background: every interval, and
// at once when half the frames are dirty or a miss had to write back its
// victim itself, so that writers streaming past the cache find clean
// victims instead of each waiting for a write-back round trip.
//
// # Concurrency and lock order
//
// frame.mu → shard.mu → evictMu. The index is 64 shards of open-addressing
// tables keyed by page id (index.go: one cache line per lookup, where a Go
// map touched two or three). A frame's key and valid flag change only under
// its write lock, together with its index entry, so a frame read-locked
// and holding page k valid is k's one cached copy: a stream read tries the
// frame after the last page's before the index (docs/decisions.md, 46).
// The eviction policy runs under evictMu and
// claims a victim frame only with TryLock, so it never waits on a frame
// while holding evictMu.
// A frame whose Flush write-back is in flight (frame.wb) cannot be evicted:
// that keeps the memory node's copy ordered, since an eviction's write-back
// of a newer version can never be overtaken by the Flush's older one.
//
// Check verifies the index, the free list and the policy agree; tests call
// it in cleanup.
//
// # Decisions
//
// S3-FIFO is the default eviction policy. With a cache of 6.25% of the
// pages (the page benchmark's shape) it equals LRU and CLOCK on uniform
// keys and beats them on skew: Zipf 0.99 hit ratio 77.6% vs 72.5% (LRU) and
// 73.3% (CLOCK); Zipf 0.8 53.9% vs 45.3% and 46.5%. Hits only touch an
// atomic frequency counter, so they take no global lock. Its ghost queue
// is a table of one-line buckets (ghost.go), not a FIFO and a map: the
// same hit ratios, one cache miss per eviction where there were several.
// (go test -run XXX -bench PolicyHitRatio -benchtime=1x ./pagestore)
package pagestore

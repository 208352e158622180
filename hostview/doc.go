// Package hostview is the DPU agent's record of which pages the host holds
// (in its cache or its Loading Zone), so that a parsed request is prefetched
// only when it will miss.
//
// Set is a sharded, bucketized cuckoo set with PD3's batched lookup
// (Fig. 5): first buckets of a whole batch are hashed and touched before any
// is searched, second buckets only for keys not found. Buckets hold 32-bit
// fingerprints compared two at a time in 64-bit words (SWAR), so the table
// costs about 4.2 bytes per key at 90% load — the PD3 Fig. 4 goal of beating
// a general-purpose hash set needs that compactness as much as speed.
//
// # Approximation
//
// A lookup can report a key the host does not hold when another key shares
// its bucket pair and fingerprint (≈16/2^32). Host View errs only toward
// "present": a false positive means no prefetch and the host's miss takes
// the direct path; correctness never depends on Host View.
//
// # Concurrency
//
// One mutex per shard; shards are chosen by key hash. The agent's
// prefetcher, transfer engine and eviction notices update it concurrently.
package hostview

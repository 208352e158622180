// Package ec serves erasure-coded volumes: a volume's extents are grouped
// K at a time on K distinct memory nodes with M parity extents on M more
// (cluster.Coded), so that it survives the loss of any M nodes of a group for
// (K+M)/K of its bytes in memory, where replication that survives M
// losses costs M+1 times.
//
// The code is Carbink's (OSDI'22) rather than Hydra's (FAST'22): a group
// codes whole extents, byte for byte, so a page lives whole on one node
// and a normal read or prefetch is one read from that node. Hydra codes
// each page across K nodes, which makes every read K reads. The price is
// on writes: a page write reads the K-1 other data pages of its row and
// writes the page and M parity pages (Remote.WriteAt).
//
// Reed-Solomon over GF(2^8) is github.com/klauspost/reedsolomon: the
// well-kept Go implementation (SIMD on amd64 and arm64), used by MinIO and
// others; its Encode and Reconstruct work on any run of a row at once, so
// a 256 KiB run is coded in one call.
//
// Shards are checked at their nodes: every page a memory node holds
// carries a CRC-32C, and a page that fails it answers pageid.ErrCorrupt,
// which this package treats as a lost shard of that row — decoded from
// the others and written back healed — so a corrupt shard is never
// returned and never decoded into wrong data.
package ec

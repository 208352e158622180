// Package memnode is the memory node: it holds volumes of 4 KiB pages in
// its RAM and serves them over a TCP or unix-socket protocol that plays the
// part of RDMA one-sided verbs (READ, WRITE, CAS, FAA), plus PREFETCH of a
// page by key (PD3 §6.2: the node maps key → address itself), TRIM, and
// volume management. The wire format is in wire.go.
//
// # Server
//
// One goroutine owns each connection and plays the NIC: it parses requests
// straight out of its read buffer (no per-request allocation), executes
// them in arrival order against the Store, and appends responses to a
// pipeline.BatchWriter whose goroutine writes whatever accumulated during
// the previous write. Many requests per syscall in both directions and
// thousands in flight per connection come from that.
//
// Memory is allocated in 1 MiB chunks on first write; unwritten pages read
// as zeroes; a TRIM that covers a whole chunk frees it. A chunk's lock makes
// each request's bytes within that chunk atomic, as a NIC is for one verb.
//
// # Client
//
// Client pipelines requests from any number of goroutines on one
// connection (internal/pipeline). When the connection breaks or stays
// silent past OpTimeout with requests outstanding, every request in flight
// fails with ErrConnLost, and the next request redials. Nothing hangs.
//
// # Errors
//
// Per-request errors (ErrOutOfRange, ErrNoVolume, ErrNoMemory, ...) travel
// as a status byte and come back as the same sentinel on the client; test
// with errors.Is. Framing violations (bad magic, reserved bits, payload over
// MaxPayload) and authentication failures close only the offending
// connection, after a best-effort error response.
//
// # Durability
//
// By default none: the node's memory is volatile, like RAM, and stopping
// or restarting it loses every volume (a host that reconnects finds
// ErrNoVolume). With a persistence directory (OpenPersistent; pd3 memnode
// --persist DIR) every mutation is logged and acknowledged only once the
// log entry is on stable storage, with group commit; checkpoints keep the
// log bounded and recovery replays it up to the first torn entry (see
// persist.go).
//
// # Decisions
//
//   - Responses are written by a writer goroutine, not by the serving
//     goroutine when its input runs dry: measured on 2 cores with 256 READs
//     in flight, flushing inline cost one write syscall per response
//     (6.5 µs/op); the writer goroutine batches ~800 KiB per write
//     (1.7 µs/op). See docs/BENCHMARKS.md.
//   - Data is copied once, from the chunk into the output buffer. Writing
//     straight from chunk memory with writev would save that copy but let a
//     later pipelined WRITE change the bytes of an earlier READ's response,
//     breaking the per-connection order this protocol promises.
package memnode

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
// Every page carries a CRC-32C of its bytes, sealed when it changes and
// checked when it is read (sums.go, about 0.15 µs a page): a page whose
// memory changed behind the store's back answers pageid.ErrCorrupt, never
// its bytes, and a write of part of such a page is refused rather than
// sealing the damage in. The page files of --persist carry no sums: a
// restart seals what they hold.
//
// # Access: tokens, grants and memory windows
//
// HELLO carries a token: the node's token reaches every volume, a Grant's
// token only the volumes whose names match its patterns. Data ops reach a
// volume only through a memory window bound on the same connection (BIND,
// in the spirit of OneSidedMW's type-2 windows): a byte range of one volume
// with read and/or write access, named by a 32-bit key the connection
// chose. The node keeps each connection's windows apart, so a key copied to
// another connection grants nothing there; an access outside the window's
// range or rights fails with ErrNoWindow; an access to a volume outside the
// connection's grant fails with ErrUnauthorised. Each access re-resolves a
// window's volume id once the volume it found last is deleted, so a window
// never carries over to a volume that later takes the same id.
//
// The Client binds one whole-volume window per volume it touches, with the
// first request for that volume, and does not wait for it: the BIND is
// queued before its key is published to other goroutines, and the node runs
// a connection's requests in order. Windows die with their connection.
//
// # Client
//
// Client pipelines requests from any number of goroutines on one
// connection (internal/pipeline). When the connection breaks or stays
// silent past OpTimeout with requests outstanding, every request in flight
// fails with pageid.ErrUnavailable, and the next request redials. Nothing hangs.
//
// # Errors
//
// Per-request errors (pageid.ErrOutOfRange, pageid.ErrNoVolume, pageid.ErrNoMemory, ...) travel
// as a status byte and come back as the same sentinel on the client; test
// with errors.Is. Framing violations (bad magic, payload over MaxPayload)
// and failed HELLOs close only the offending connection, after a
// best-effort error response.
//
// # Durability
//
// By default none: the node's memory is volatile, like RAM, and stopping
// or restarting it loses every volume (a host that reconnects finds
// pageid.ErrNoVolume). With a persistence directory (OpenPersistent; pd3 memnode
// --persist DIR) every mutation is logged and acknowledged only once the
// log entry is on stable storage, with group commit; checkpoints keep the
// log bounded and recovery replays it up to the first torn entry (see
// persist.go).
//
// # Decisions
//
//   - Responses are written by a writer goroutine, not by the serving
//     goroutine when its input runs dry: flushing inline cost one write
//     syscall per response, the writer batches many (docs/decisions.md,
//     19).
//   - Data is copied once, from the chunk into the output buffer. Writing
//     straight from chunk memory with writev would save that copy but let a
//     later pipelined WRITE change the bytes of an earlier READ's response,
//     breaking the per-connection order this protocol promises.
package memnode

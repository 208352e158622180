// Package nbd is pd3's NBD server: every volume is an export, served to
// user-space clients (fio's nbd engine, nbdinfo, nbdcopy, qemu-io, nbdfuse)
// and through them to mkfs and databases.
//
// Handshake: fixed newstyle only, with NO_ZEROES; options EXPORT_NAME,
// ABORT, LIST, INFO, GO, STRUCTURED_REPLY, LIST_META_CONTEXT and
// SET_META_CONTEXT (base:allocation), and STARTTLS when Server.TLS is set
// (x509 certificates; with TLSRequired every other option but ABORT is
// refused with NBD_REP_ERR_TLS_REQD until TLS is on, and an EXPORT_NAME
// in clear ends the connection, so no export name or data crosses in
// clear); unknown options, and STARTTLS without TLS, are refused with
// NBD_REP_ERR_UNSUP. Over TLS the agent's tap mirror still sees requests
// in clear (it reads above TLS); a packet mirror sees only ciphertext, so
// the agent does not prefetch for TLS connections it captures. INFO/GO always report NBD_INFO_EXPORT
// and NBD_INFO_BLOCK_SIZE (minimum 1: any alignment works, partial pages
// are read-modify-written; preferred 4096; maximum MaxRequest). The whole
// negotiation must finish within HandshakeTimeout.
//
// Transmission: READ (simple or structured replies; errors per request,
// never a dropped connection), WRITE (+FUA), FLUSH, TRIM (frees whole
// memory-node chunks), WRITE_ZEROES (+NO_HOLE: zeroes are written; without
// it whole pages are trimmed; FAST_ZERO with NO_HOLE is ENOTSUP), CACHE
// (reads the range into the host cache; with an agent its parser has
// already prefetched it), BLOCK_STATUS for base:allocation (a range
// that holds no memory at the node — never written, or trimmed whole — is
// hole+zero, at the node's 1 MiB grain, after the volume's dirty pages
// are written back; without a Mapper backend everything is data, which
// the spec always allows), DISC.
// Advertised flags are exactly these: HAS_FLAGS, SEND_FLUSH, SEND_FUA,
// SEND_TRIM, SEND_WRITE_ZEROES, SEND_FAST_ZERO, SEND_CACHE, CAN_MULTI_CONN,
// SEND_DF with structured replies, and READ_ONLY (without the write flags)
// for read-only exports.
//
// Requests are validated before any backend sees them: unknown commands
// or flags, a zero length, a range past the end (EINVAL; ENOSPC for
// writes, as the spec asks), writes to read-only exports (EPERM), READ or
// WRITE over MaxRequest (EOVERFLOW; a refused WRITE's payload is skipped up
// to 64 MiB, beyond that the connection is closed). A bad request magic or
// a truncated header ends that connection only.
//
// Concurrency: one reader goroutine per connection parses and validates.
// A page-aligned READ of up to pagestore.MaxAsyncPages pages that is not
// a stream — the random-read case, a database's 8 KiB pages — is run to
// completion without a worker when the backend is a PageReader: cache or
// Loading Zone hits are answered by the reader itself, and misses start
// remote reads whose completion (on the memory-node client's reader
// goroutine) fills the frames and appends the reply. That replaces two
// goroutine hand-offs per request (reader → worker, memory-node reader →
// worker) with none. A WRITE of as many pages without FUA is written into
// the cache by the reader the same way when the backend is a PageWriter
// and the pages can be taken at once. Everything else, and reads the page store cannot
// start without waiting (page busy, only dirty frames to evict, too many
// loads in flight), goes to Workers goroutines that execute requests
// concurrently. Replies are appended to one BatchWriter and leave in
// completion order; a completion that finds the reply buffer full (a
// client not reading) hands its reply to a goroutine rather than stall
// the shared memory-node reader. FLUSH (and FUA) flush the shared cache,
// so they cover writes completed on every connection.
//
// Files: server.go (Server, exports, one connection's life), handshake.go
// (negotiation), transmit.go (reading, validating and executing requests),
// reply.go (simple and structured replies, buffers). The protocol's
// values and the request header are package nbdproto, shared with the
// agent's parser and the Go client.
//
// Durability: FLUSH/FUA return once the data is at the memory node, and
// on its stable storage when it runs with --persist. Without --persist
// the memory node is RAM: restarting it loses data.
package nbd

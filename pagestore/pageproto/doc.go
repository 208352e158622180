// Package pageproto is the page-server protocol of the PD3 "database-style
// page server": GET and PUT of 4 KiB pages by 8-byte id, and SYNC, with
// fixed 16-byte headers (wire.go) so the DPU agent can follow a byte stream
// without help.
//
// # Server
//
// One reader goroutine per connection parses frames and queues requests;
// a fixed pool of workers (Server.Workers, default one per CPU) executes them
// one at a time each, blocking on their own cache misses like the
// application threads of the paper's page server; one writer goroutine per
// connection sends replies in completion order, batched. A connection has
// at most MaxInFlight requests queued or running; past that its reader stops
// reading and TCP pushes back on the client.
//
// Errors per request come back as a Status (no such volume, out of range,
// I/O error at the memory node, unknown op); a framing violation closes
// that connection only, after the replies already owed.
//
// # SYNC
//
// SYNC returns once every PUT acknowledged before the SYNC was sent is at
// the memory node. It does not order against PUTs still in flight: wait for
// their replies first, as with NBD FLUSH.
package pageproto

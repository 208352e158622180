// Package host is pd3's composition root: it assembles the pieces into
// running processes — a memory node (StartMemnode), a host (Start:
// memory-node client → page store → page server, NBD and FUSE, with an
// embedded agent or a Link to an agent process) and an agent process
// (RunAgent) — and their metrics. The pd3 command, the benchmarks and the
// integration tests all start pd3 through it, so there is one way to wire
// the system, and each start undoes what it started when a step fails.
package host

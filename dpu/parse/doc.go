// Package parse turns a client connection's byte stream into the page
// accesses its requests make (PD3 Table 1), as the DPU agent reads them
// before the host serves them: PageParser for the page protocol
// (pagestore/pageproto), NBDParser for NBD, handshake included. A parser
// takes bytes split anywhere, never panics on garbage, and stops at the
// first thing it cannot follow (ErrLostSync); the host is unaffected.
package parse

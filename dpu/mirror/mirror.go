// Package mirror is the contract between a frontend's connection reader
// and whoever watches its request bytes (the DPU agent). It is a leaf
// package so frontends (page server, NBD) and the agent can share it
// without importing each other.
package mirror

import (
	"io"
	"net"
)

// Stream receives the bytes one client connection delivers, exactly as the
// host read them and before the host parses them. Observe must not retain
// or modify b and must not block: the host's path is never delayed by it.
type Stream interface {
	Observe(b []byte)
	Close()
}

// Mirror hands out a Stream per client connection. The tap (Conn) is one
// way to feed it; an AF_PACKET mirror that sees packets before the host
// reads them is another.
type Mirror interface {
	NewStream() Stream
}

// Conn wraps a connection so that every successful Read is observed. The
// bytes are shown to the stream in place, without a copy.
type Conn struct {
	net.Conn
	S Stream
	// R, if set, is read instead of Conn (the connection read another
	// way, such as a sockio.Reader of Conn).
	R io.Reader
}

func (c Conn) Read(b []byte) (int, error) {
	var n int
	var err error
	if c.R != nil {
		n, err = c.R.Read(b)
	} else {
		n, err = c.Conn.Read(b)
	}
	if n > 0 {
		c.S.Observe(b[:n])
	}
	return n, err
}

// Package testnet holds helpers for tests that talk to pd3 servers with
// raw bytes.
package testnet

import (
	"io"
	"net"
	"testing"
	"time"
)

// Exchange sends chunks to addr, half-closes, and reads until the server
// hangs up. It fails the test if the server neither answers to the end nor
// closes within 5 seconds: a server may reject input, never stall on it.
func Exchange(t testing.TB, addr string, chunks ...[]byte) []byte {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	go func() {
		for _, c := range chunks {
			if _, err := nc.Write(c); err != nil {
				return
			}
		}
		nc.(*net.TCPConn).CloseWrite()
	}()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, err := io.ReadAll(nc)
	if err != nil {
		t.Fatalf("server neither answered nor hung up: %v", err)
	}
	return out
}

// Package memnodetest runs memory nodes for other packages' tests: a
// node on a loopback port with one volume, a client connected to it, and
// both gone when the test ends.
package memnodetest

import (
	"context"
	"net"
	"testing"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// Node serves a fresh in-memory node on 127.0.0.1 until the test ends and
// returns a client of it and a volume "v" of size bytes made there.
func Node(t testing.TB, ctx context.Context, size uint64) (*memnode.Client, pageid.VolumeInfo) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("memnodetest: %v", err)
	}
	srv := &memnode.Server{Store: memnode.NewStore(0)}
	go srv.Serve(ctx, ln)
	c, err := memnode.Dial(ctx, ln.Addr().String(), memnode.ClientOptions{})
	if err != nil {
		srv.Close()
		t.Fatalf("memnodetest: dialling the node: %v", err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	vol, err := c.Create(ctx, "v", size)
	if err != nil {
		t.Fatalf("memnodetest: creating volume v: %v", err)
	}
	return c, vol
}

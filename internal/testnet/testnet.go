// Package testnet holds helpers for tests that talk to pd3 servers with
// raw bytes.
package testnet

import (
	"context"
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

// Gate is a TCP proxy that can hold bytes back: the answers (server →
// client) alone, so a test can line up requests that a fast server would
// otherwise answer before the next is sent (Hold); or both directions, a
// link that goes down and comes back without resetting its connections
// (Cut). Held bytes are delivered in order after Release.
type Gate struct {
	Addr string // where clients connect
	// answers and requests are closed while bytes flow that way.
	answers, requests chan struct{}
	mu                chan struct{} // a one-slot lock over both
}

// NewGate proxies to target until the test ends; it starts open.
func NewGate(t testing.TB, target string) *Gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gate{Addr: ln.Addr().String(), answers: make(chan struct{}), requests: make(chan struct{}), mu: make(chan struct{}, 1)}
	close(g.answers)
	close(g.requests)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			// Released first, so no copier stays blocked on a held gate.
			t.Cleanup(func() { g.Release(); c.Close(); s.Close() })
			go g.pipe(s, c, &g.requests)
			go g.pipe(c, s, &g.answers)
		}
	}()
	return g
}

// pipe copies src to dst, waiting at *gate before each write; the end of
// src ends dst.
func (g *Gate) pipe(dst, src net.Conn, gate *chan struct{}) {
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			g.mu <- struct{}{}
			open := *gate
			<-g.mu
			<-open
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Hold makes answers wait until Release.
func (g *Gate) Hold() { g.hold(&g.answers) }

// Cut makes bytes wait both ways until Release: a link that is down.
func (g *Gate) Cut() { g.hold(&g.answers, &g.requests) }

func (g *Gate) hold(gates ...*chan struct{}) {
	g.mu <- struct{}{}
	for _, gate := range gates {
		select {
		case <-*gate: // open: close it
			*gate = make(chan struct{})
		default: // held already
		}
	}
	<-g.mu
}

// Release delivers held bytes and lets later ones through.
func (g *Gate) Release() {
	g.mu <- struct{}{}
	for _, gate := range []chan struct{}{g.answers, g.requests} {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}
	<-g.mu
}

// Pair returns the two ends of a connection on a listener of network at
// addr ("tcp" on "127.0.0.1:0", or "unix" on a socket path), closed at
// the end of the test.
func Pair(t testing.TB, network, addr string) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err = net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-acc
	if b == nil {
		a.Close()
		t.Fatal("accepting the test connection failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// Server is what FuzzServer drives: any of pd3's servers.
type Server interface {
	Serve(ctx context.Context, ln net.Listener) error
	Close() error
}

// FuzzServer serves srv on a loopback port for the whole fuzz run and
// feeds it each input, after prefix (a greeting the fuzzer need not
// find). Each input must get answers or a hang-up (Exchange), and check,
// called once the server has hung up, must find its state whole.
func FuzzServer(f *testing.F, srv Server, check func() error, prefix ...[]byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(context.Background(), ln)
	f.Cleanup(func() { srv.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		Exchange(t, ln.Addr().String(), append(prefix[:len(prefix):len(prefix)], in)...)
		if err := check(); err != nil {
			t.Fatal(err)
		}
	})
}

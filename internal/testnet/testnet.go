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

// Gate is a TCP proxy whose answers (server → client bytes) can be held
// back, so a test can line up requests that a fast server would otherwise
// answer before the next is sent.
type Gate struct {
	Addr string // where clients connect
	open chan struct{}
	mu   chan struct{} // a one-slot lock over open
}

// NewGate proxies to target until the test ends; it starts open.
func NewGate(t testing.TB, target string) *Gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gate{Addr: ln.Addr().String(), open: make(chan struct{}), mu: make(chan struct{}, 1)}
	close(g.open)
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
			t.Cleanup(func() { c.Close(); s.Close() })
			go io.Copy(s, c)
			go g.answer(c, s)
		}
	}()
	return g
}

func (g *Gate) answer(c, s net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			g.mu <- struct{}{}
			open := g.open
			<-g.mu
			<-open
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			c.Close()
			return
		}
	}
}

// Hold makes answers wait until Release. Bytes the server sends meanwhile
// are delivered in order after it.
func (g *Gate) Hold() {
	g.mu <- struct{}{}
	g.open = make(chan struct{})
	<-g.mu
}

// Release delivers held answers and lets later ones through.
func (g *Gate) Release() {
	g.mu <- struct{}{}
	select {
	case <-g.open:
	default:
		close(g.open)
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

// Package netsrv is the accept loop both pd3 servers share: it tracks
// listeners and connections so Close can stop them all, runs one handler
// goroutine per connection and waits for them.
package netsrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/pd3-go/pd3/internal/sockio"
)

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("server closed")

// Group is a set of listeners and the connections they accepted. The zero
// value is ready to use.
type Group struct {
	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Serve accepts on ln until ctx ends or Close is called, running handle in
// a goroutine per connection and closing the connection when it returns.
// It returns nil when stopped, an error if accepting fails.
func (g *Group) Serve(ctx context.Context, ln net.Listener, handle func(net.Conn)) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	if g.lns == nil {
		g.lns = make(map[net.Listener]struct{})
		g.conns = make(map[net.Conn]struct{})
	}
	g.lns[ln] = struct{}{}
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		nc, err := ln.Accept()
		if err != nil {
			g.mu.Lock()
			delete(g.lns, ln)
			closed := g.closed
			g.mu.Unlock()
			if closed || ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accepting on %s: %w", ln.Addr(), err)
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			nc.Close()
			return nil
		}
		g.conns[nc] = struct{}{}
		g.wg.Add(1)
		g.mu.Unlock()
		go func() {
			defer g.wg.Done()
			handle(nc)
			nc.Close()
			g.mu.Lock()
			delete(g.conns, nc)
			g.mu.Unlock()
		}()
	}
}

// Close stops every listener and connection and waits for the handlers.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	for ln := range g.lns {
		ln.Close()
	}
	for c := range g.conns {
		// A handler may be blocked in sockio's poll(2) on c.
		sockio.Close(c)
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// LogEnd logs why a connection ended, once, at the level its cause
// deserves: nothing for a clean close (EOF, the server's own Close); info
// for a client that went away (reset, broken pipe) or stayed silent past a
// deadline; a warning for anything else, which is a client breaking the
// protocol or a failure the operator should see.
func LogEnd(log *slog.Logger, proto string, nc net.Conn, err error, attrs ...any) {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return
	}
	attrs = append([]any{"remote", nc.RemoteAddr().String()}, append(attrs, "err", err)...)
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrDeadlineExceeded) {
		log.Info(proto+": client went away", attrs...)
		return
	}
	log.Warn(proto+": closing connection", attrs...)
}

// ReaderConn is a connection whose reads go through R: a poll(2)-based
// reader of the socket, or a buffer holding bytes already peeked from it.
// TLS runs over it so that nothing read before the handshake is lost.
type ReaderConn struct {
	net.Conn
	R io.Reader
}

func (c ReaderConn) Read(b []byte) (int, error) { return c.R.Read(b) }

package pipeline

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// corkedSessions starts n sessions sharing cork, each over loopback TCP to
// a toy server that answers every request at once.
func corkedSessions(t *testing.T, n int, cork *Cork) []*Session {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	answered := make(chan struct{})
	close(answered)
	sessions := make([]*Session, n)
	for i := range sessions {
		cl, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		sv, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { sv.Close() })
		toyServer(t, sv, answered)
		sessions[i] = New(cl, toy{}, Options{Cork: cork})
		t.Cleanup(func() { sessions[i].Close(io.EOF) })
	}
	return sessions
}

// Requests sent while the cork is held leave at its release, each
// session's in one write; without the cork each session writes its first
// request at once and the rest in a second write at least.
func TestCorkSendsEachSessionsHeldRequestsInOneWrite(t *testing.T) {
	cork := new(Cork)
	sessions := corkedSessions(t, 3, cork)
	var calls []*Call
	cork.Hold()
	for range 4 {
		for _, s := range sessions {
			calls = append(calls, send(t, s, make([]byte, 8)))
		}
	}
	for i, s := range sessions {
		assert.Zero(t, s.Writer().Writes.Load(), "session %d wrote while the cork was held", i)
	}
	cork.Release()
	for i, s := range sessions {
		assert.Equal(t, uint64(1), s.Writer().Writes.Load(), "session %d: writes for its 4 requests", i)
	}
	for _, c := range calls {
		require.NoError(t, c.Wait(context.Background()))
	}

	// Released, the cork holds nothing: a lone request leaves at once.
	c := send(t, sessions[0], make([]byte, 8))
	assert.Equal(t, uint64(2), sessions[0].Writer().Writes.Load())
	require.NoError(t, c.Wait(context.Background()))
}

// Requests sent from many goroutines while another holds and releases
// the cork over and over all leave, and so do those sent after it let go
// for good: none is left behind a release it missed.
func TestCorkLosesNoRequestToARaceWithRelease(t *testing.T) {
	cork := new(Cork)
	sessions := corkedSessions(t, 4, cork)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holding := make(chan struct{})
	go func() {
		defer close(holding)
		for range 2000 {
			cork.Hold()
			cork.Release()
		}
	}()
	var senders sync.WaitGroup
	for g := range 8 {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for i := range 300 {
				if i == 200 {
					<-holding // the rest after the last release
				}
				c := send(t, sessions[(g+i)%len(sessions)], make([]byte, 8))
				// A request held by a cork nobody releases times out here.
				if !assert.NoError(t, c.Wait(ctx)) {
					return
				}
			}
		}()
	}
	senders.Wait()
}

// A nil cork holds nothing.
func TestNilCorkHoldsNothing(t *testing.T) {
	s := corkedSessions(t, 1, nil)[0]
	var cork *Cork
	cork.Hold()
	c := send(t, s, make([]byte, 8))
	require.NoError(t, c.Wait(context.Background()))
	cork.Release()
}

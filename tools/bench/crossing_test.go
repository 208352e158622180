package bench

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveCrossing runs ServeCrossing on a loopback listener until the test
// ends and returns its address.
func serveCrossing(t *testing.T, forward, poll string, proxy bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeCrossing(ctx, ln, forward, poll, proxy) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// TestCrossingFloors: every wait mode of echo, relay and client passes
// each request's answer back whole (a wrong frame size would hang or
// misalign the next read, which the timeout catches).
func TestCrossingFloors(t *testing.T) {
	for _, f := range crossingFloors {
		t.Run(f.name, func(t *testing.T) {
			addr := serveCrossing(t, "", f.echoPoll, false)
			if f.hops == 2 {
				addr = serveCrossing(t, addr, f.relayPoll, f.proxy)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			lat, err := crossingRun(ctx, addr, 200, f.client)
			require.NoError(t, err)
			require.Len(t, lat, 200)
			for _, l := range lat {
				assert.Positive(t, l)
			}
		})
	}
}

// TestCrossingProxy: the byte relay carries any protocol both ways, in
// order, with many bytes in flight.
func TestCrossingProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() { // an upstream that echoes every byte
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(nc, nc); nc.Close() }()
		}
	}()
	addr := serveCrossing(t, ln.Addr().String(), "", true)
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go nc.Write(want)
	got := make([]byte, len(want))
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.ReadFull(nc, got)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func TestCrossingRefusesBadModes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	assert.ErrorContains(t, ServeCrossing(context.Background(), ln, "", "sometimes", false), "want all or upstream")
	assert.ErrorContains(t, ServeCrossing(context.Background(), ln, "", "", true), "needs --forward")
}

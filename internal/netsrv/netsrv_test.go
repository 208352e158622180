package netsrv

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCloseStopsListenersAndConnections(t *testing.T) {
	var g Group
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() {
		served <- g.Serve(context.Background(), ln, func(nc net.Conn) { io.Copy(io.Discard, nc) })
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	nc.Write([]byte("x"))
	time.Sleep(20 * time.Millisecond)
	g.Close() // must not hang on the open connection
	assert.NoError(t, <-served)
	nc.SetReadDeadline(time.Now().Add(time.Second))
	_, err = nc.Read(make([]byte, 1))
	assert.Error(t, err, "connection closed by the server")
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	assert.ErrorIs(t, g.Serve(context.Background(), ln2, nil), ErrClosed)
}

package netsrv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
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
	handling := make(chan struct{})
	go func() {
		served <- g.Serve(context.Background(), ln, func(nc net.Conn) { close(handling); io.Copy(io.Discard, nc) })
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	nc.Write([]byte("x"))
	<-handling // the connection is being served
	g.Close()  // must not hang on the open connection
	assert.NoError(t, <-served)
	nc.SetReadDeadline(time.Now().Add(time.Second))
	_, err = nc.Read(make([]byte, 1))
	assert.Error(t, err, "connection closed by the server")
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	assert.ErrorIs(t, g.Serve(context.Background(), ln2, nil), ErrClosed)
}

func TestLogEndLevels(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"clean close", io.EOF, ""},
		{"server closed", fmt.Errorf("reading: %w", net.ErrClosed), ""},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, "level=INFO msg=\"x: client went away\""},
		{"idle past deadline", fmt.Errorf("handshake: %w", os.ErrDeadlineExceeded), "level=INFO"},
		{"protocol violation", errors.New("x: bad magic 0x4e"), "level=WARN msg=\"x: closing connection\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			LogEnd(slog.New(slog.NewTextHandler(&buf, nil)), "x", a, tc.err, "export", "disk0")
			if tc.want == "" {
				assert.Empty(t, buf.String())
				return
			}
			assert.Contains(t, buf.String(), tc.want)
			assert.Equal(t, 1, strings.Count(buf.String(), "\n"), "logged once")
			assert.Contains(t, buf.String(), "export=disk0")
		})
	}
}

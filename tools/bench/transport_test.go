package bench

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/pageid"
)

// TestAnswerModeServesThePagesAskedFor checks that the request-and-answer
// ceiling does the work it stands for: every request, however the bytes
// of a burst are split, is answered in order by its tag and the page at
// its offset, so its rate cannot come from answering less.
func TestAnswerModeServesThePagesAskedFor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeRaw(ctx, ln, 1<<20, true, true) }()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
	})
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })

	const n = 200 // more than one writev of answers
	reqs := make([]byte, n*rrRequest)
	for i := range n {
		r := reqs[i*rrRequest:]
		binary.LittleEndian.PutUint64(r[8:], uint64(1000+i))                // tag
		binary.LittleEndian.PutUint64(r[16:], uint64(i*37%256)*pageid.Size) // offset
	}
	// A burst split mid-request.
	for _, part := range [][]byte{reqs[:45], reqs[45:3000], reqs[3000:]} {
		_, err := nc.Write(part)
		require.NoError(t, err)
	}
	ans := make([]byte, rrAnswer)
	for i := range n {
		_, err := io.ReadFull(nc, ans)
		require.NoError(t, err, "answer %d", i)
		assert.Equal(t, uint64(1000+i), binary.LittleEndian.Uint64(ans[8:]), "answer %d's tag", i)
		assert.True(t, workload.CheckPage(pageid.Key(i*37%256), ans[rrHeader:]), "answer %d carries the page asked for", i)
	}
}

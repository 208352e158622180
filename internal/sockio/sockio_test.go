package sockio

import (
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pair(t *testing.T, network, addr string) (a, b net.Conn) { return testnet.Pair(t, network, addr) }

func TestReaderReadsInOrderAndSeesEOF(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{
		{"tcp", "127.0.0.1:0"},
		{"unix", filepath.Join(t.TempDir(), "s")},
	} {
		t.Run(tc.network, func(t *testing.T) {
			a, b := pair(t, tc.network, tc.addr)
			r := NewReader(b)
			require.NotNil(t, r)
			r.Direct()
			go func() {
				for i := 0; i < 100; i++ {
					a.Write([]byte{byte(i)})
					if i%10 == 0 {
						time.Sleep(time.Millisecond) // let the reader wait in poll(2)
					}
				}
				a.Close()
			}()
			got, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Len(t, got, 100)
			for i, c := range got {
				require.Equal(t, byte(i), c)
			}
			assert.Positive(t, r.Wakeups.Load(), "the reader waited in poll(2)")
		})
	}
}

// An idle connection costs nothing: a reader blocked in poll(2) with no
// input is never woken (no timed polling), and Close wakes it.
func TestIdleReaderMakesNoWakeupsAndCloseWakesIt(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	r.Direct()
	got := make(chan error, 1)
	go func() {
		var p [8]byte
		for {
			if _, err := r.Read(p[:]); err != nil {
				got <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond) // the reader is in poll(2)
	a.Write([]byte("x"))
	require.Eventually(t, func() bool { return r.Wakeups.Load() >= 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // the reader is back in poll(2)
	idle := r.Wakeups.Load()
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, idle, r.Wakeups.Load(), "an idle connection woke its reader")
	select {
	case err := <-got:
		t.Fatalf("reader returned while idle: %v", err)
	default:
	}
	require.NoError(t, Close(b))
	select {
	case err := <-got:
		assert.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the reader blocked in poll(2)")
	}
}

func TestNonSocketsAreLeftToTheCaller(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Nil(t, NewReader(a))
}

// Until Direct, reads go through the network poller, so a handshake's
// read deadline applies.
func TestDeadlinesApplyBeforeDirect(t *testing.T) {
	_, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var p [1]byte
	_, err := r.Read(p[:])
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
}

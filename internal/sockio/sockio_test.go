package sockio

import (
	"io"
	"net"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/internal/testutil"
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
			var busy Busy
			r.DirectIf(&busy) // Direct, with a gauge of readers in poll(2)
			go func() {
				for i := 0; i < 100; i++ {
					if i%10 == 0 {
						untilPolling(&busy) // the reader drained what came and waits in poll(2)
					}
					a.Write([]byte{byte(i)})
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
// input is never woken (no timed polling), and Close wakes it. Nothing here
// depends on timing: the test waits for events, and the idle window only
// gives a timed poll the chance to show itself.
func TestIdleReaderMakesNoWakeupsAndCloseWakesIt(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	r.Direct()
	var got atomic.Int64 // bytes the reader has read
	done := make(chan error, 1)
	go func() {
		var p [64]byte
		for {
			n, err := r.Read(p[:])
			got.Add(int64(n))
			if err != nil {
				done <- err
				return
			}
		}
	}()
	// Send until a byte has woken the reader out of poll(2) (however late
	// the reader first got there), then until it has read everything.
	var sent int64
	require.Eventually(t, func() bool {
		if r.Wakeups.Load() > 0 {
			return true
		}
		a.Write([]byte("x"))
		sent++
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return got.Load() == sent }, 10*time.Second, time.Millisecond)
	idle := r.Wakeups.Load()
	time.Sleep(200 * time.Millisecond) // the idle window: a timed poll would wake the reader here
	assert.Equal(t, idle, r.Wakeups.Load(), "an idle connection woke its reader")
	select {
	case err := <-done:
		t.Fatalf("reader returned while idle: %v", err)
	default:
	}
	require.NoError(t, Close(b))
	select {
	case err := <-done:
		assert.Error(t, err)
	case <-time.After(10 * time.Second):
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

// A reader told to Spin takes input that arrives within its window
// without sleeping in poll(2), and a connection that goes quiet stops
// spinning once the window has passed: idle stays idle. The window is
// far longer (10 s) or far shorter (1 ms) than the gaps the test makes,
// so nothing depends on how fast this machine is.
func TestSpinTakesInputWithoutWakeupAndStopsWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		input  bool // a second byte comes within the window
	}{{"input within the window", 10 * time.Second, true}, {"quiet past the window", time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, "tcp", "127.0.0.1:0")
			r := NewReader(b)
			require.NotNil(t, r)
			var busy Busy
			r.DirectIf(&busy)
			r.Spin(tc.window, nil)
			got := readAll(t, r, b)
			// The first byte finds the reader asleep (nothing was drained
			// yet) or spinning; either way it is read.
			a.Write([]byte("x"))
			require.Eventually(t, func() bool { return got.Load() == 1 }, 10*time.Second, time.Millisecond)
			if tc.input { // drained: it spins
				require.Eventually(t, func() bool { return r.Spins.Load() > 0 }, 10*time.Second, time.Millisecond)
			} else { // its window passed: it sleeps in poll(2)
				require.Eventually(t, func() bool { return busy.Polls() > 0 }, 10*time.Second, time.Millisecond)
			}
			woken, spins := r.Wakeups.Load(), r.Spins.Load()
			if tc.input {
				require.Positive(t, spins, "the reader spins after its input ran dry")
				a.Write([]byte("y"))
				require.Eventually(t, func() bool { return got.Load() == 2 }, 10*time.Second, time.Millisecond)
				assert.Equal(t, woken, r.Wakeups.Load(), "input within the window woke the reader from poll(2)")
				return
			}
			time.Sleep(200 * time.Millisecond) // the quiet window: a spin or a timed poll would show here
			assert.Equal(t, spins, r.Spins.Load(), "a quiet connection kept spinning past its window")
			assert.Equal(t, woken, r.Wakeups.Load(), "a quiet connection was woken")
		})
	}
}

// A peer whose input comes later than the window is not spun for: the
// reader that spun in vain once waits in poll(2) next time, and spins
// again once input comes within the window. The late input is written
// only after the reader sleeps in poll(2), past its whole window; the
// prompt input is written as soon as the previous byte is read, 20 ms
// being far longer than that takes.
func TestSpinStopsForAPeerSlowerThanTheWindow(t *testing.T) {
	a, r, busy := spinner(t, 20*time.Millisecond)
	got := readAll(t, r, r.nc)
	a.Write([]byte("x"))
	require.Eventually(t, func() bool { return got.Load() == 1 }, 10*time.Second, time.Millisecond)
	untilPolling(busy) // spun its window in vain, now asleep
	spun := r.Spins.Load()
	require.Positive(t, spun, "the reader spins after its input ran dry")
	a.Write([]byte("y")) // late: the gap exceeded the window
	require.Eventually(t, func() bool { return got.Load() == 2 }, 10*time.Second, time.Millisecond)
	untilPolling(busy)
	assert.Equal(t, spun, r.Spins.Load(), "the reader spun for a peer slower than its window")

	// Prompt input: the next drained Read spins again. Each byte is written
	// as soon as the reader waits for it; on a loaded machine one such gap
	// may still exceed the window, so a few are allowed.
	for i := int64(3); i < 53 && r.Spins.Load() == spun; i++ {
		a.Write([]byte("z"))
		require.Eventually(t, func() bool { return got.Load() == i }, 10*time.Second, time.Millisecond)
		for r.Spins.Load() == spun && busy.Polls() == 0 {
			runtime.Gosched()
		}
	}
	assert.Greater(t, r.Spins.Load(), spun, "input within the window did not bring the spin back")
}

// readAll reads r (of conn b) on a goroutine until it fails, counting the
// bytes; the cleanup closes b and waits for the goroutine.
func readAll(t *testing.T, r *Reader, b net.Conn) *atomic.Int64 {
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var p [64]byte
		for {
			n, err := r.Read(p[:])
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { Close(b); <-done })
	return &got
}

func TestSpinnersLetOneReaderSpinAtATime(t *testing.T) {
	var places Spinners
	a1, b1 := pair(t, "tcp", "127.0.0.1:0")
	a2, b2 := pair(t, "tcp", "127.0.0.1:0")
	r1, r2 := NewReader(b1), NewReader(b2)
	require.NotNil(t, r1)
	require.NotNil(t, r2)
	var busy1, busy2 Busy
	for i, r := range []*Reader{r1, r2} {
		r.DirectIf([]*Busy{&busy1, &busy2}[i])
		r.Spin(10*time.Second, &places)
	}
	got1, got2 := readAll(t, r1, b1), readAll(t, r2, b2)
	a1.Write([]byte("x"))
	require.Eventually(t, func() bool { return got1.Load() == 1 && r1.Spins.Load() > 0 }, 10*time.Second, time.Millisecond,
		"the first reader spins after its input ran dry")
	assertSleeps(t, a2, r2, &busy2, got2, "a second reader while the only place was taken")
}

// assertSleeps sends r's connection (written through a) bytes one at a
// time, each once r waits in poll(2) (busy is its gauge), and asserts r
// reads each after sleeping there, never spinning.
func assertSleeps(t *testing.T, a net.Conn, r *Reader, busy *Busy, got *atomic.Int64, who string) {
	t.Helper()
	for i := range 3 {
		untilPolling(busy)
		a.Write([]byte("y"))
		require.Eventually(t, func() bool { return got.Load() == int64(i+1) }, 10*time.Second, time.Millisecond)
	}
	assert.Zero(t, r.Spins.Load(), "%s spun", who)
	assert.Positive(t, r.Wakeups.Load(), "%s did not sleep in poll(2)", who)
}

func TestColdReaderSleepsAtOnce(t *testing.T) {
	a, r, busy := spinner(t, 10*time.Second)
	r.Cold(true)
	assertSleeps(t, a, r, busy, readAll(t, r, r.nc), "a cold reader")
}

// spinner is a direct Reader of a loopback TCP connection, gauged by its
// own Busy, that spins for window; a writes to it.
func spinner(t *testing.T, window time.Duration) (net.Conn, *Reader, *Busy) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	busy := new(Busy)
	r.DirectIf(busy)
	r.Spin(window, nil)
	return a, r, busy
}

// Reads, waits and writes are on every request's path: none allocates.
func TestReadsWaitsAndWritesAllocateNothing(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	r.Direct()
	w := NewWriter(a)
	require.NotNil(t, w)
	out, in := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		n, err := w.TryWrite(out)
		if err != nil || n != len(out) {
			t.Fatalf("wrote %d, %v", n, err)
		}
		if err := r.Wait(); err != nil {
			t.Fatal(err)
		}
		if n, err := r.TryRead(in); err != nil || n != len(in) {
			t.Fatalf("read %d, %v", n, err)
		}
	})
	assert.Zero(t, allocs)
}

// DirectIf waits in poll(2) only while Busy is lone; otherwise the
// reader parks in the network poller and poll(2) never wakes it. The
// test switches lone back and forth on one connection and reads the same
// way both times: each read must wait, since the bytes come later.
func TestDirectIfWaitsInPollOnlyWhileLone(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	var busy Busy
	r.DirectIf(&busy)
	readLate := func(lone bool) {
		t.Helper()
		go writeOnceWaiting(a, &busy, lone)
		var p [8]byte
		n, err := r.Read(p[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	var p [8]byte
	a.Write([]byte{0})
	_, err := r.Read(p[:]) // leaves the reader drained: the next read waits
	require.NoError(t, err)

	for _, tc := range []struct {
		lone bool
		want string
	}{{false, "network poller"}, {true, "poll(2)"}, {false, "network poller"}} {
		busy.Add(-int32(busy.Count()))
		if !tc.lone {
			busy.Add(2)
		}
		before := r.Wakeups.Load()
		readLate(tc.lone)
		if tc.lone {
			assert.Greater(t, r.Wakeups.Load(), before, "a lone reader did not wait in poll(2)")
		} else {
			assert.Equal(t, before, r.Wakeups.Load(), "a reader under load waited in poll(2)")
		}
	}
}

// Handed sends one wait, the next, to the network poller, even while lone
// says poll(2); the waits after it are poll(2) again.
func TestHandedParksOneWaitInTheNetworkPoller(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	var busy Busy // lone: DirectIf(nil), with a gauge of readers in poll(2)
	r.DirectIf(&busy)
	var p [8]byte
	a.Write([]byte{0})
	_, err := r.Read(p[:]) // drained: the next read waits
	require.NoError(t, err)
	for _, tc := range []struct {
		handed, poll bool
	}{{false, true}, {true, false}, {false, true}, {true, false}} {
		if tc.handed {
			r.Handed()
		}
		before := r.Wakeups.Load()
		go writeOnceWaiting(a, &busy, tc.poll)
		n, err := r.Read(p[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		if tc.poll {
			assert.Greater(t, r.Wakeups.Load(), before, "the wait after an unhanded read was not in poll(2)")
		} else {
			assert.Equal(t, before, r.Wakeups.Load(), "the wait after Handed was in poll(2)")
		}
	}
}

// Fewer Readers than the process has Ps (one at least) wait in poll(2)
// at once; the others park in the network poller, so a P stays free for
// whatever an answer readies. Without the bound, idle connections held
// every P in poll(2) and a memory node's reply waited for the runtime's
// monitor.
func TestPollPlacesLeaveAPFree(t *testing.T) {
	var busy Busy
	places := max(1, runtime.GOMAXPROCS(0)-1)
	var writers []net.Conn
	var readers []*Reader
	for range places + 1 {
		a, b := pair(t, "tcp", "127.0.0.1:0")
		r := NewReader(b)
		require.NotNil(t, r)
		r.DirectIf(&busy)
		writers, readers = append(writers, a), append(readers, r)
	}
	// The first readers take every place, blocked in poll(2).
	done := make(chan error, places)
	for i := range places {
		go func() {
			var p [8]byte
			_, err := readers[i].Read(p[:])
			done <- err
		}()
	}
	require.Eventually(t, func() bool { return busy.Polls() == places }, 5*time.Second, time.Millisecond)
	// The last one, drained by a short read, has input waiting: without a
	// place it reads through the network poller, with no poll(2) (with
	// one, poll(2) would return at once and count a wake-up).
	last := readers[places]
	var p [8]byte
	writers[places].Write([]byte{0})
	n, err := last.Read(p[:]) // a short read: drained
	require.NoError(t, err)
	require.Equal(t, 1, n)
	writers[places].Write([]byte{1})
	before := last.Wakeups.Load()
	n, err = last.Read(p[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, before, last.Wakeups.Load(), "a reader past the places waited in poll(2)")
	assert.Equal(t, places, busy.Polls())
	for i := range places {
		writers[i].Write([]byte{1})
		require.NoError(t, <-done)
	}
	assert.Zero(t, busy.Polls(), "every place given back")
}

// A Reader back from the network poller that waits in poll(2) while
// another connection waits in the poller for input that matters (a
// client's answers outstanding, its own not counted, or a server's next
// request) first wakes a thread to poll the network; one woken from
// poll(2) does not need to.
func TestReaderBackFromThePollerNudgesAPoller(t *testing.T) {
	a, b := pair(t, "tcp", "127.0.0.1:0")
	r := NewReader(b)
	require.NotNil(t, r)
	var busy Busy
	r.DirectIf(&busy)
	r.Client()
	var p [8]byte
	a.Write([]byte{0})
	_, err := r.Read(p[:]) // drained: the next read waits
	require.NoError(t, err)
	for i, tc := range []struct {
		handed      bool // the wait before this one was in the network poller
		self, other bool // client connections awaiting answers
		server      bool // a server's Reader parked
		nudge       bool // want: a thread woken to poll the network
	}{
		{},
		{other: true},                            // woken from poll(2): never the poller
		{handed: true, other: true, nudge: true}, // from the poller, another awaits
		{handed: true, self: true},               // its own answers count for nothing
		{handed: true, self: true, other: true, nudge: true},
		{handed: true, server: true, nudge: true}, // a server's reader parked
		{handed: true},
	} {
		if tc.handed {
			r.Handed()
			go writeOnceWaiting(a, &busy, false)
			_, err := r.Read(p[:])
			require.NoError(t, err)
		}
		busy.awaited.Store(0)
		busy.parked.Store(0)
		r.Awaiting(tc.self)
		for _, on := range []bool{tc.self, tc.other} {
			if on {
				busy.Await(true)
			}
		}
		if tc.server {
			busy.parked.Add(1)
		}
		before, nudges := r.Wakeups.Load(), busy.Nudges()
		go writeOnceWaiting(a, &busy, true)
		n, err := r.Read(p[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		assert.Greater(t, r.Wakeups.Load(), before, "case %d %+v: not in poll(2)", i, tc)
		if tc.nudge {
			assert.Equal(t, nudges+1, busy.Nudges(), "case %d %+v: no thread woken to poll the network", i, tc)
		} else {
			assert.Equal(t, nudges, busy.Nudges(), "case %d %+v: a thread woken for nothing", i, tc)
		}
	}
	busy.parked.Store(0)
	busy.awaited.Store(0)
	// A server's Reader parked is counted while it waits there.
	srv := NewReader(a)
	require.NotNil(t, srv)
	srv.DirectIf(&busy)
	srv.Handed()
	done := make(chan error, 1)
	go func() {
		_, err := srv.Read(p[:])
		done <- err
	}()
	require.Eventually(t, func() bool { return busy.Parked() == 1 }, 5*time.Second, time.Millisecond)
	b.Write([]byte{1})
	require.NoError(t, <-done)
	assert.Zero(t, busy.Parked())
}

func TestBusyIsLoneWithOneRequestAtMost(t *testing.T) {
	var nilBusy *Busy
	nilBusy.Add(5) // counts nothing
	assert.True(t, nilBusy.Lone(), "a nil Busy is always lone")

	var b Busy
	for _, tc := range []struct {
		add  int32
		lone bool
	}{{0, true}, {1, true}, {1, false}, {30, false}, {-31, true}, {-1, true}} {
		b.Add(tc.add)
		assert.Equal(t, tc.lone, b.Lone(), "after adding %d", tc.add)
	}
	// Two client connections: never lone, whatever is in flight.
	b.AddConn(1)
	assert.True(t, b.Lone(), "one connection, one request")
	b.AddConn(1)
	assert.False(t, b.Lone(), "two connections")
	b.Add(-b.n.Load())
	assert.False(t, b.Lone(), "two idle connections")
	b.AddConn(-1)
	assert.True(t, b.Lone())
	nilBusy.AddConn(3)
	assert.True(t, nilBusy.Lone())
}

// untilPolling returns once a reader counted by b waits in poll(2) (or
// after 10 s: the test's own assertions then fail).
func untilPolling(b *Busy) {
	for end := time.Now().Add(10 * time.Second); b.Polls() == 0 && time.Now().Before(end); {
		runtime.Gosched()
	}
}

// writeOnceWaiting writes one byte to a once the reader on the other end
// waits for it: in poll(2) (b's gauge says when), or else parked in the
// network poller (testutil.LetPark).
func writeOnceWaiting(a net.Conn, b *Busy, inPoll bool) {
	if inPoll {
		untilPolling(b)
	} else {
		testutil.LetPark()
	}
	a.Write([]byte{1})
}

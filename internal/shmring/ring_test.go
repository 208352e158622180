package shmring

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/shm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newRing(t *testing.T, size int) (*Ring, *Ring) {
	r, err := shm.Create("", Bytes(size))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	p, err := Attach(r.Bytes(), size)
	require.NoError(t, err)
	c, err := Attach(r.Bytes(), size)
	require.NoError(t, err)
	return p, c
}

// TestStreamIntegrity: a producer goroutine sends 200 K messages of random
// sizes (forcing wrap-around padding) through a 16 KiB ring; the consumer,
// sleeping on the doorbell when empty, gets each one intact and in order.
func TestStreamIntegrity(t *testing.T) {
	prod, cons := newRing(t, 16<<10)
	const n = 200000
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, 3000)
		for i := uint64(0); i < n; i++ {
			m := buf[:8+rng.IntN(2000)]
			binary.LittleEndian.PutUint64(m, i)
			for j := 8; j < len(m); j++ {
				m[j] = byte(i) + byte(j)
			}
			for !prod.Send(m[:8], m[8:]) {
				runtime.Gosched() // full: the consumer makes room
			}
		}
	}()
	for i := uint64(0); i < n; {
		m := cons.Next()
		if m == nil {
			cons.Wait(time.Second)
			continue
		}
		require.GreaterOrEqual(t, len(m), 8)
		require.Equal(t, i, binary.LittleEndian.Uint64(m), "message order")
		for j := 8; j < len(m); j++ {
			if m[j] != byte(i)+byte(j) {
				t.Fatalf("message %d corrupted at byte %d", i, j)
			}
		}
		cons.Release()
		i++
	}
	assert.Zero(t, cons.Used())
}

func TestFullAndOversized(t *testing.T) {
	prod, cons := newRing(t, 4096)
	assert.False(t, prod.Send(make([]byte, 4096)), "larger than half the ring")
	sent := 0
	for prod.Send(make([]byte, 1000)) {
		sent++
	}
	assert.Equal(t, 4, sent, "4 × (8+1000 rounded) fit in 4096")
	require.NotNil(t, cons.Next())
	cons.Release()
	assert.True(t, prod.Send(make([]byte, 1000)), "room again after a release")
}

func TestWaitWakesOnSend(t *testing.T) {
	prod, cons := newRing(t, 4096)
	go func() {
		for prod.sleep.Load() == 0 { // the consumer is going to sleep on the doorbell
			runtime.Gosched()
		}
		prod.Send([]byte("hello"))
	}()
	start := time.Now()
	for cons.Next() == nil {
		cons.Wait(5 * time.Second)
	}
	assert.Less(t, time.Since(start), 2*time.Second, "the doorbell woke the consumer")
	assert.Equal(t, []byte("hello"), cons.Next())
}

// TestSendLazyLeavesConsumerAsleep: a lazy message waits for the next
// doorbell or the consumer's timeout, and is then delivered in order.
func TestSendLazyLeavesConsumerAsleep(t *testing.T) {
	prod, cons := newRing(t, 4096)
	woke := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		cons.Wait(300 * time.Millisecond)
		woke <- time.Since(start)
	}()
	for prod.sleep.Load() == 0 {
		runtime.Gosched()
	}
	// The flag is up before the consumer reaches the futex; nothing tells
	// when it is there, and the test is about a sleeper.
	time.Sleep(20 * time.Millisecond)
	require.True(t, prod.SendLazy([]byte("lazy")))
	assert.GreaterOrEqual(t, <-woke, 250*time.Millisecond, "a lazy send must not ring the doorbell")
	require.True(t, prod.Send([]byte("eager")))
	assert.Equal(t, []byte("lazy"), cons.Next())
	cons.Release()
	assert.Equal(t, []byte("eager"), cons.Next())
}

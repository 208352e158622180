package procstat

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSelf(t *testing.T) {
	before, err := CPU(0)
	require.NoError(t, err)
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}
	rss, err := RSS(os.Getpid())
	require.NoError(t, err)
	assert.Greater(t, rss, uint64(60<<20), "the 64 MiB just touched is resident")
	own, err := Private(0)
	require.NoError(t, err)
	assert.Greater(t, own, uint64(60<<20), "the 64 MiB just touched is this process's own")
	assert.Less(t, own, rss, "the binary's text is resident but not private")
	after, err := CPU(0)
	require.NoError(t, err)
	assert.Greater(t, after, before)
	_, err = RSS(1 << 30)
	assert.Error(t, err)
	_ = buf[len(buf)-1]
}

package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChildKeepsItsLastWords: what a child prints as it exits on SIGTERM
// is in its Output once Stop returns. Stop reaped the child (closing its
// stderr pipe) while the line reader could still be behind, and lost
// the last lines: TestPersistentMemnodeSurvivesSIGKILL missed the memory
// node's "stopped" line in CI once.
func TestChildKeepsItsLastWords(t *testing.T) {
	const script = `trap 'i=0; while [ $i -lt 20 ]; do echo "pd3: stopping $i" >&2; i=$((i+1)); done; echo "pd3: stopped" >&2; exit 0' TERM
echo "pd3: thing listening on 127.0.0.1:1" >&2
while :; do sleep 0.01; done`
	for i := range 50 {
		c, err := StartChild(context.Background(), "sh", []string{"thing"}, "-c", script)
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1:1", c.Addrs["thing"])
		c.Stop()
		if !assert.Contains(t, c.Output(), "pd3: stopped\n", "run %d", i) {
			break
		}
	}
}

// TestChildThatExitsBeforeListening: StartChild reports a child that
// ends without saying where it listens, with what it printed.
func TestChildThatExitsBeforeListening(t *testing.T) {
	_, err := StartChild(context.Background(), "sh", []string{"thing"}, "-c", `echo "pd3: error: no room" >&2; exit 1`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exited before listening")
	assert.Contains(t, err.Error(), "pd3: error: no room")
}

package loopport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFreePortsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Free(64)
	require.NoError(t, err)
	seen := map[int]bool{}
	low := ephemeralLow()
	for _, p := range ports {
		assert.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, base)
		assert.Less(t, p, low)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d is free after Free returns", p)
		ln.Close()
	}
}

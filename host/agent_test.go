package host

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An agent process's wiring: a host with --dpu shm:NAME attaches to it and
// reads through it; when it stops, its region is gone and the host goes on
// directly. A capture it cannot start is an error that undoes the rest.
func TestRunAgentServesAHost(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	name := fmt.Sprintf("test-agent-%d", time.Now().UnixNano())

	actx, stop := context.WithCancel(ctx)
	states := make(chan *Agent, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunAgent(actx, AgentConfig{Name: name, Memnode: node.Addr, LZBytes: 1 << 20, CacheBytes: 1 << 20, RingBytes: 1 << 20, Metrics: "127.0.0.1:0"},
			func(s *Agent) { states <- s })
	}()
	s := <-states
	assert.NotEmpty(t, s.MetricsAddr)
	h, err := Start(ctx, Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096, DPU: SplitAgent(name)})
	require.NoError(t, err)
	defer h.Close(ctx)
	require.Eventually(t, h.Link.Attached, 5*time.Second, 10*time.Millisecond)
	buf := make([]byte, 4096)
	require.NoError(t, h.Store.Get(ctx, 1<<48|7, buf))
	assert.Equal(t, uint64(1), h.Link.AgentReads.Load(), "the miss went through the agent")

	stop()
	require.NoError(t, <-done)
	_, err = os.Stat(shm.Path(name))
	assert.True(t, os.IsNotExist(err), "the region is removed: %v", err)
	require.Eventually(t, func() bool { return !h.Link.Attached() }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, h.Store.Get(ctx, 1<<48|9, buf), "the host reads directly without its agent")

	err = RunAgent(ctx, AgentConfig{Name: name, Memnode: node.Addr, Captures: []Capture{{Proto: split.ProtoPage, Addr: "0.0.0.0:1"}}}, nil)
	assert.ErrorContains(t, err, "agent: watching 0.0.0.0:1")
	_, err = os.Stat(shm.Path(name))
	assert.True(t, os.IsNotExist(err), "a failed start removes its region")
}

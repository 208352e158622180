package split

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/pagestore/remotetest"
)

// TestLinkConformance runs the Remote contract (pagestore/api.go) against
// a Link, with an agent attached and without one (dpu's
// TestRemoteConformance runs the other Remotes).
func TestLinkConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps remotetest.Capabilities
		open func(t *testing.T) (pagestore.Remote, uint16)
	}{
		{"Link, agent attached", remotetest.Capabilities{Trimmer: true, Mapper: true, Bounded: true}, func(t *testing.T) (pagestore.Remote, uint16) {
			r := newSplitRig(t)
			agentConn, err := memnode.Dial(r.ctx, r.c.Addr(), memnode.ClientOptions{})
			require.NoError(t, err)
			t.Cleanup(func() { agentConn.Close() })
			l := OpenLink(r.name, memnode.Remote{C: r.c})
			t.Cleanup(l.Close)
			r.startAgent(t, agentConn) // it serves a host's link once one is open
			require.Eventually(t, l.Attached, 5*time.Second, time.Millisecond)
			return l, r.vol.ID
		}},
		{"Link, no agent (direct)", remotetest.Capabilities{Trimmer: true, Mapper: true, Bounded: true}, func(t *testing.T) (pagestore.Remote, uint16) {
			r := newSplitRig(t)
			l := OpenLink(r.name, memnode.Remote{C: r.c})
			t.Cleanup(l.Close)
			require.False(t, l.Attached())
			return l, r.vol.ID
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, vol := tc.open(t)
			remotetest.Run(t, r, vol, tc.caps)
		})
	}
}

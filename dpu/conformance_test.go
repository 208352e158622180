package dpu

import (
	"context"
	"testing"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/pagestore/remotetest"
)

// bareRemote has no optional capability, like a minimal third-party Remote.
type bareRemote struct{ r pagestore.Remote }

func (b bareRemote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	return b.r.ReadPage(ctx, k, dst)
}

func (b bareRemote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	return b.r.WritePages(ctx, keys, pages)
}

// TestRemoteConformance runs the Remote contract (pagestore/api.go) against
// every Remote in pd3. A new Remote joins this table.
func TestRemoteConformance(t *testing.T) {
	node := remotetest.Capabilities{PagesReader: true, AsyncReader: true, AsyncPagesReader: true, Trimmer: true, Mapper: true, Bounded: true}
	all := node
	all.StreamReader = true
	sync := remotetest.Capabilities{PagesReader: true, Trimmer: true, Mapper: true}
	for _, tc := range []struct {
		name string
		caps remotetest.Capabilities
		open func(t *testing.T) (pagestore.Remote, uint16)
	}{
		{"MemRemote", sync, func(t *testing.T) (pagestore.Remote, uint16) {
			return pagestore.NewMemRemote(), 1
		}},
		{"Faults(MemRemote)", sync, func(t *testing.T) (pagestore.Remote, uint16) {
			return pagestore.NewFaults(pagestore.NewMemRemote()), 1
		}},
		{"Faults(bare Remote): fallbacks", sync, func(t *testing.T) (pagestore.Remote, uint16) {
			return pagestore.NewFaults(bareRemote{pagestore.NewMemRemote()}), 1
		}},
		{"memnode.Remote", node, func(t *testing.T) (pagestore.Remote, uint16) {
			c, vol := testNode(t, context.Background())
			return memnode.Remote{C: c}, vol.ID
		}},
		{"Engine", all, func(t *testing.T) (pagestore.Remote, uint16) {
			r := newRig(t, 64)
			return r.e, r.vol.ID
		}},
		{"Engine(replica.Remote)", all, func(t *testing.T) (pagestore.Remote, uint16) {
			r := replicatedRig(t, 64)
			return r.e, r.vol.ID
		}},
		{"LeapRemote", all, func(t *testing.T) (pagestore.Remote, uint16) {
			r := newRig(t, 64)
			return LeapRemote{Engine: r.e, L: NewLeap(func() uint64 { return 0 })}, r.vol.ID
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, vol := tc.open(t)
			remotetest.Run(t, r, vol, tc.caps)
		})
	}
}

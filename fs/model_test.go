package fs_test

import (
	"testing"

	"github.com/pd3-go/pd3/internal/fsmodel"
	"github.com/pd3-go/pd3/internal/testutil"
)

// TestRandomOpsMatchAReference runs internal/fsmodel (fsx and fsstress in
// one) on a mount whose host cache (1 MiB) is half a file, with clean
// remounts and crashes that follow an fsync of every file. PD3_SEED
// replays a run.
func TestRandomOpsMatchAReference(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	ops := fsmodel.Run(t, fsmodel.Config{
		Dir: e.dir, Ref: t.TempDir(), Steps: testutil.Soak(t, 1000, 8000), Seed: testutil.Seed(t),
		Remount: func(crash bool) string {
			dir := e.dir
			if crash {
				e.crash()
			} else {
				e.unmount()
			}
			e = mount(t, addr, dir, 1<<20)
			return e.dir
		},
	})
	t.Logf("calls that succeeded on both sides: %v", ops)
}

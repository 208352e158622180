package nbd

import (
	"fmt"
	"testing"

	"github.com/pd3-go/pd3/internal/nbdmodel"
	"github.com/pd3-go/pd3/internal/testutil"
)

// TestRandomRequestsMatchAModel: batches of random requests of every kind,
// replies in any order, over a cache of 16 pages, each reply checked
// against a model of the export (internal/nbdmodel), with simple and with
// structured replies; a second connection reads the whole export back.
// PD3_SEED replays.
func TestRandomRequestsMatchAModel(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			const size = 8 << 20
			r := newRig(t, size, 16*4096)
			nbdmodel.Check(t, r.addr, "disk0", size, structured, testutil.Soak(t, 300, 1200), nil)
		})
	}
}

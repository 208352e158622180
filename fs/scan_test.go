package fs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestScanIsToldFromLookups: READs that continue one another within
// scanGap are a scan from the third on, once they carry streamRead bytes
// in all; a database's lookups (a page or two, near each other) are not,
// and neither is a READ that jumps back or far ahead.
func TestScanIsToldFromLookups(t *testing.T) {
	type read struct {
		off, n int
		scan   bool
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"the gaps between cached pages", []read{{0, 48 << 10, false}, {64 << 10, 48 << 10, false}, {128 << 10, 48 << 10, true}, {192 << 10, 48 << 10, true}}},
		{"lookups near each other", []read{{0, 4096, false}, {8192, 4096, false}, {40960, 8192, false}, {45056, 4096, false}}},
		{"a jump back ends it", []read{{0, 64 << 10, false}, {64 << 10, 64 << 10, false}, {128 << 10, 64 << 10, true}, {0, 64 << 10, false}, {64 << 10, 64 << 10, false}}},
		{"a jump ahead ends it", []read{{0, 64 << 10, false}, {64 << 10, 64 << 10, false}, {128 << 10, 64 << 10, true}, {1 << 20, 64 << 10, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s stream
			for i, r := range tc.reads {
				assert.Equal(t, r.scan, s.scanning(uint64(r.off), r.n), "read %d", i)
				assert.Equal(t, r.scan, s.active(), "read %d", i)
			}
		})
	}
}

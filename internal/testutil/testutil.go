// Package testutil holds helpers shared by pd3's tests.
package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed returns a random seed, logged so a failure can be replayed with
// PD3_SEED=n.
func Seed(t testing.TB) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("PD3_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PD3_SEED=%q: %v", v, err)
		}
		s = n
	}
	t.Logf("seed %d (PD3_SEED=%d to replay)", s, s)
	return s
}

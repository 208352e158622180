package split

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts must be gone when the tests end: servers,
// connections, agents and background loops all stop when closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

package fs

import (
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

// ErrMounted means another host holds the filesystem's lease: two hosts
// writing one tree would each delete the other's new files as orphans.
var ErrMounted = errors.New("filesystem is mounted by another host")

// The mount lease is a caslease.Lease on one word of the metadata volume.
const leaseOff = pageid.Size

// mountErr names a lease conflict as the filesystem's.
func mountErr(err error) error {
	if errors.Is(err, pageid.ErrHeld) {
		return fmt.Errorf("fs: %w: %w", ErrMounted, err)
	}
	return fmt.Errorf("fs: %w", err)
}

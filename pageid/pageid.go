package pageid

import (
	"errors"
	"fmt"
)

// Size is the size of every page.
const Size = 4096

// PageBits is the width of the page-number part of a Key.
const PageBits = 48

// Key is a page key: volume id in the top 16 bits, page number in the low
// 48. It is the 8-byte page id of the PD3 page server.
type Key uint64

// MakeKey builds the key of page pageNo of volume vol.
func MakeKey(vol uint16, pageNo uint64) Key {
	return Key(uint64(vol)<<PageBits | pageNo&(1<<PageBits-1))
}

// Volume returns the volume id of k.
func (k Key) Volume() uint16 { return uint16(k >> PageBits) }

// Page returns the page number of k.
func (k Key) Page() uint64 { return uint64(k) & (1<<PageBits - 1) }

func (k Key) String() string { return fmt.Sprintf("%d:%d", k.Volume(), k.Page()) }

// Errors callers branch on, whichever layer returns them (wrapped with
// the details).
var (
	// ErrNoVolume: the key's volume does not exist, or is not served here.
	ErrNoVolume = errors.New("no such volume")
	// ErrOutOfRange: a page or byte range past the end of its volume.
	ErrOutOfRange = errors.New("page out of range")
	// ErrCorrupt: stored state (a memory node's files, a filesystem's
	// metadata) cannot be read back.
	ErrCorrupt = errors.New("stored state is corrupt")
)

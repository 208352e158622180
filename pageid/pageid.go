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

// VolumeInfo describes a volume where its pages live: its id (the top
// bits of its keys), its size in bytes and its name.
type VolumeInfo struct {
	ID   uint16
	Size uint64
	Name string
	// Stored is the memory the volume holds at its memory node, in whole
	// allocation chunks: pages never written, and whole chunks trimmed,
	// cost nothing. It is a snapshot, as of the answer that carried it.
	Stored uint64
}

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
	// ErrExists: a volume of that name exists already.
	ErrExists = errors.New("volume exists")
	// ErrHeld: another host holds the volume (its lease, its record in the
	// cluster): that host must let it go, or its lease run out, first.
	ErrHeld = errors.New("held by another host")
	// ErrFenced: another host has taken the volume over (it presented a
	// newer fencing token), so this host's writes are refused.
	ErrFenced = errors.New("fenced: the volume was taken over by another host")
	// ErrNoMemory: the memory node has no room for the pages.
	ErrNoMemory = errors.New("out of memory at the memory node")
	// ErrNoSpace: a persistent memory node has no disk room to log a
	// write. Reads go on; writes are taken again once room returns.
	ErrNoSpace = errors.New("no space left on the memory node's disk (--persist); free room there and writes resume")
	// ErrUnavailable: the memory node could not be reached, or the
	// connection to it broke with the request in flight. Retrying
	// (a new connection, another replica) may succeed.
	ErrUnavailable = errors.New("memory node unavailable")
	// ErrClosed: the client or store was used after Close.
	ErrClosed = errors.New("closed")
)

// Runs joins adjacent runs of a volume's bytes of one kind (hole or data)
// before handing them to Emit: a map answered chunk by chunk, page by
// page or extent by extent comes out as the fewest runs. Add runs in
// order, then Flush.
type Runs struct {
	Emit func(off, n uint64, hole bool)
	at   uint64
	n    uint64
	hole bool
}

// Add appends n bytes at off, of the kind hole says.
func (r *Runs) Add(off, n uint64, hole bool) {
	if r.n > 0 && hole == r.hole && r.at+r.n == off {
		r.n += n
		return
	}
	r.Flush()
	r.at, r.n, r.hole = off, n, hole
}

// Flush hands on the run being joined, if any.
func (r *Runs) Flush() {
	if r.n > 0 {
		r.Emit(r.at, r.n, r.hole)
		r.n = 0
	}
}

package fs

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// storedTTL bounds how old the st_blocks the host answers may be. The
// kernel keeps attributes longer (attrTimeout) unless a fsync drops
// them, so a stat may show older blocks still; this bounds the LISTs.
const storedTTL = time.Second

// storedCache is the memory each volume holds at the memory node, for
// st_blocks and statfs: one LIST refreshes every file at once, at most
// once per storedTTL, and concurrent callers share that one round trip. A
// write reaches the node at write-back (an fsync, or the background pass),
// so until then the blocks lag the data, as on a filesystem with delayed
// allocation; fsync makes the next stat fresh.
//
// Lock order: FS.mu → mu (attributes are filled under the model's lock
// from the cached values); refresh is never taken with FS.mu held.
type storedCache struct {
	refresh sync.Mutex // one LIST at a time; callers wait for it
	mu      sync.RWMutex
	at      time.Time
	by      map[uint16]uint64 // volume id → bytes stored (volumes/ too)
	total   uint64            // this filesystem's volumes, metadata included
}

// refreshStored asks the node for what every volume stores, unless the
// last answer is younger than storedTTL. A node that cannot be reached
// leaves the last values. FS.mu must not be held: this is a round trip.
func (f *FS) refreshStored(ctx context.Context) {
	s := &f.storedCache
	s.refresh.Lock()
	defer s.refresh.Unlock()
	s.mu.RLock()
	fresh := time.Since(s.at) < storedTTL
	s.mu.RUnlock()
	if fresh {
		return
	}
	vs, err := f.cfg.Backend.List(ctx)
	if err != nil {
		return
	}
	prefix := "fs." + f.cfg.Name + "."
	by, total := make(map[uint16]uint64, len(vs)), uint64(0)
	for _, v := range vs {
		by[v.ID] = v.Stored
		if strings.HasPrefix(v.Name, prefix) {
			total += v.Stored
		}
	}
	s.mu.Lock()
	s.by, s.total, s.at = by, total, time.Now()
	s.mu.Unlock()
}

// storedOf is the last known memory held by volume vol, and by the whole
// filesystem.
func (f *FS) storedOf(vol uint16) (bytes, total uint64) {
	s := &f.storedCache
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.by[vol], s.total
}

// volumeOpener is a Backend that says what one volume stores (a memory
// node's OPEN). Absent (a replica group, whose volumes are no one node's):
// after an fsync the next stat asks for every volume (LIST).
type volumeOpener interface {
	Open(ctx context.Context, name string) (pageid.VolumeInfo, error)
}

// storedChanged refreshes what volume vol (named name) stores, after an
// fsync whose caller may well look at the blocks next: one OPEN, so the
// cost does not grow with the number of files. It returns the bytes
// stored, or ok false when it could not learn them (the next stat asks
// every volume instead).
func (f *FS) storedChanged(ctx context.Context, vol uint16, name string) (stored uint64, ok bool) {
	s := &f.storedCache
	if c, isOpener := f.cfg.Backend.(volumeOpener); isOpener {
		if v, err := c.Open(ctx, name); err == nil && v.ID == vol {
			s.mu.Lock()
			if s.by != nil {
				s.total += v.Stored - s.by[vol]
				s.by[vol] = v.Stored
			}
			s.mu.Unlock()
			return v.Stored, true
		}
	}
	s.mu.Lock()
	s.at = time.Time{}
	s.mu.Unlock()
	return 0, false
}

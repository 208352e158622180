package memnode

import (
	"fmt"
	"hash/crc32"

	"github.com/pd3-go/pd3/pageid"
)

// Every page a node holds carries a CRC-32C of its bytes, computed when
// the page changes and checked whenever it is read: memory that decays or
// is overwritten behind the store's back answers pageid.ErrCorrupt instead
// of wrong bytes, and the host reads the page elsewhere (another replica,
// or a decode from the other shards of an erasure-coded row).
//
// A chunk's sums are stored XORed with the sum of a page of zeroes, so
// that the zeroed sums of fresh memory match the zeroed pages it holds.

const pagesPerChunk = ChunkSize / pageid.Size

var zeroPageSum = crc32.Checksum(make([]byte, pageid.Size), crcTable)

func pageSum(p []byte) uint32 { return crc32.Checksum(p, crcTable) ^ zeroPageSum }

// sealLocked recomputes the sums of the pages of c under bytes
// [co, co+n); c.mu is held for writing and c.data is allocated.
func (c *chunk) sealLocked(co, n uint64) {
	for pg := co / pageid.Size; pg*pageid.Size < co+n; pg++ {
		c.sums[pg] = pageSum(c.data[pg*pageid.Size : (pg+1)*pageid.Size])
	}
}

// verifyPartialLocked checks the pages that bytes [co, co+n) of c cover
// only in part, before a change of those bytes would seal the rest of
// each page: a corrupt page is refused, not made to look whole.
func (c *chunk) verifyPartialLocked(co, n uint64) error {
	if co%pageid.Size != 0 {
		if err := c.verifyLocked(co, 1); err != nil {
			return err
		}
	}
	if end := co + n; end%pageid.Size != 0 && (co%pageid.Size == 0 || end/pageid.Size != co/pageid.Size) {
		return c.verifyLocked(end-1, 1)
	}
	return nil
}

// verifyLocked checks the pages of c under bytes [co, co+n) against their
// sums; c.mu is held and c.data is allocated.
func (c *chunk) verifyLocked(co, n uint64) error {
	for pg := co / pageid.Size; pg*pageid.Size < co+n; pg++ {
		if c.sums[pg] != pageSum(c.data[pg*pageid.Size:(pg+1)*pageid.Size]) {
			return fmt.Errorf("%w: page %d of its chunk fails its checksum", pageid.ErrCorrupt, pg)
		}
	}
	return nil
}

// CorruptForTest flips a byte of volume id at off without changing its
// page's checksum, as failing memory would: the next read of that page
// answers pageid.ErrCorrupt. For tests of the layers above.
func (s *Store) CorruptForTest(id uint16, off uint64) error {
	v, err := s.volume(id)
	if err != nil {
		return err
	}
	if err := v.check(off, 1); err != nil {
		return err
	}
	c := v.chunks.get(off/ChunkSize, false)
	if c == nil {
		return fmt.Errorf("memnode: byte %d of volume %q holds no memory to corrupt", off, v.info.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data == nil {
		return fmt.Errorf("memnode: byte %d of volume %q holds no memory to corrupt", off, v.info.Name)
	}
	c.data[off%ChunkSize] ^= 0xff
	return nil
}

package fs

import (
	"context"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

// inlineMax is the largest file whose bytes live in its inode, in the
// metadata, rather than in a memory-node volume of its own. A volume
// costs a CREATE (made ahead, but made), a DELETE at unlink, one of 65,535
// volume ids and a whole chunk (1 MiB) of the node's memory for any byte
// written; most files of a source tree or a mail spool are a few KiB. A
// page: the host keeps every inline byte in memory, and a journal record
// carries a changed file's bytes whole.
const inlineMax = pageid.Size

// inline reports whether n is a regular file whose bytes live in Data
// (the model's lock held).
func (n *inode) inline() bool { return n.isReg() && n.Vol == "" }

// writeInline writes data at off into inline file c if the result still
// fits; false when c is not inline or would grow past inlineMax (the
// caller promotes it and writes to its volume). c.io is held shared.
func (f *FS) writeInline(c *inode, off uint64, data []byte) bool {
	end := off + uint64(len(data))
	f.mu.Lock()
	defer f.mu.Unlock()
	if !c.inline() || end > inlineMax {
		return false
	}
	if end > uint64(len(c.Data)) {
		c.Data = append(c.Data, make([]byte, end-uint64(len(c.Data)))...)
	}
	copy(c.Data[off:], data)
	c.Size = uint64(len(c.Data))
	c.touch(nowNs())
	f.changedLocked(c)
	return true
}

// readInline copies inline file c's bytes at off into dest; false when c
// is not inline. c.io is held shared.
func (f *FS) readInline(c *inode, off uint64, dest []byte) (int, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !c.inline() {
		return 0, false
	}
	if off >= uint64(len(c.Data)) {
		return 0, true
	}
	return copy(dest, c.Data[off:]), true
}

// truncateInline sets inline file c's size if it stays inline; false
// otherwise. c.io is held exclusively.
func (f *FS) truncateInline(c *inode, size uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !c.inline() || size > inlineMax {
		return false
	}
	if size < uint64(len(c.Data)) {
		c.Data = c.Data[:size:size] // a later growth copies, and zeroes
	} else {
		c.Data = append(c.Data, make([]byte, size-uint64(len(c.Data)))...)
	}
	c.Size = size
	c.touch(nowNs())
	f.changedLocked(c)
	return true
}

// promote gives inline file c a volume of its own and moves its bytes
// there; nothing if it has one already. c.io is held exclusively, so no
// write of c is under way. The bytes reach the memory node before the
// inode names the volume: they may have been fsynced inline, and the next
// metadata save (which drops them from the inode) may come before any
// write-back.
func (f *FS) promote(ctx context.Context, c *inode) error {
	f.mu.RLock()
	inline, data := c.inline(), c.Data
	f.mu.RUnlock()
	if !inline {
		return nil
	}
	v, err := f.newVolume(ctx, c.Ino)
	if err != nil {
		return err
	}
	if len(data) > 0 {
		c.reach(uint64(len(data)))
		// The volume is new: its last page starts from zeroes.
		err = f.cfg.Store.WriteFresh(ctx, v.ID, 0, data, 0)
		if err == nil {
			err = f.cfg.Store.FlushVolume(ctx, v.ID)
		}
		if err != nil {
			f.cfg.Store.RemoveVolumePages(v.ID, pageUp(uint64(len(data)))/pageid.Size)
			f.freeVolume(context.WithoutCancel(ctx), v.Name)
			return fmt.Errorf("fs: moving file %d to a volume: %w", c.Ino, err)
		}
	}
	f.ra.changed(c)
	f.mu.Lock()
	c.Vol, c.vol, c.Data = v.Name, v.ID, nil
	f.byVol[v.ID] = c
	f.changedLocked(c)
	f.mu.Unlock()
	return nil
}

// moveOut is promote for a caller that does not hold c.io.
func (f *FS) moveOut(ctx context.Context, c *inode) error {
	c.io.Lock()
	defer c.io.Unlock()
	return f.promote(ctx, c)
}

// volOf is c's volume (0 while it has none).
func (f *FS) volOf(c *inode) uint16 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return c.vol
}

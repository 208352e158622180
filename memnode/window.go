package memnode

import (
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"math"
	"path"
)

// Grant limits what the connections presenting Token reach: the volumes
// whose names match one of Volumes (path.Match patterns, e.g. "tenant1.*").
// Such a connection may create, open, list, delete and bind windows on
// those volumes only; anything else is refused with ErrUnauthorised.
type Grant struct {
	Token   string
	Volumes []string
}

// maxWindows bounds the windows of one connection, so a client cannot grow
// the node's memory by binding without end (one per volume id is plenty).
const maxWindows = 1 << 16

// window is one memory window of a connection: a byte range of a volume and
// the access allowed on it. v caches the volume the window's id resolved to
// at the last access; it is checked again once that volume is deleted.
type window struct {
	vol        uint16
	start, end uint64 // [start, end)
	access     uint32
	fence      uint64 // the writer's fencing token; 0: none
	v          *volume
}

// scope returns what a HELLO token reaches: all (nil patterns, ok) for the
// node's token, a grant's patterns for a grant's token, !ok for neither.
// Every token is compared in constant time.
func (s *Server) scope(token []byte) (patterns []string, ok bool) {
	if s.Token == "" && len(s.Grants) == 0 {
		return nil, true
	}
	if s.Token != "" && subtle.ConstantTimeCompare(token, []byte(s.Token)) == 1 {
		ok = true
	}
	for _, g := range s.Grants {
		if subtle.ConstantTimeCompare(token, []byte(g.Token)) == 1 && !ok {
			patterns, ok = g.Volumes, true
		}
	}
	return patterns, ok
}

// allowed reports whether the connection's grant covers volume name.
func (c *conn) allowed(name string) bool {
	if !c.scoped {
		return true
	}
	for _, p := range c.patterns {
		if m, _ := path.Match(p, name); m {
			return true
		}
	}
	return false
}

// checkName refuses volume-management ops outside the connection's grant.
func (c *conn) checkName(name string) error {
	if !c.allowed(name) {
		return fmt.Errorf("%w: volume %q is outside this connection's grant", ErrUnauthorised, name)
	}
	return nil
}

// bind records the window of a BIND request.
func (c *conn) bind(h *ReqHeader, p []byte) Status {
	if len(p) != bindPayloadSize || h.Window == 0 || binary.LittleEndian.Uint32(p[12:]) != 0 {
		return StatusBadRequest
	}
	length, access := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint32(p[8:])
	if access == 0 || access&^AccessAll != 0 {
		return StatusBadRequest
	}
	if _, dup := c.windows[h.Window]; dup {
		return StatusBadRequest
	}
	if len(c.windows) >= maxWindows {
		return StatusNoMemory
	}
	end := h.Offset + length
	if length == 0 || end < h.Offset {
		end = math.MaxUint64
	}
	if c.windows == nil {
		c.windows = make(map[uint32]*window)
	}
	w := &window{vol: h.Volume, start: h.Offset, end: end, access: access, fence: binary.LittleEndian.Uint64(p[16:])}
	c.windows[h.Window] = w
	if w.fence != 0 && access&AccessWrite != 0 {
		// Presented now, not at the first write: the writes of the host
		// this token supersedes must stop before the new holder serves.
		if v, err := c.s.Store.volume(h.Volume); err == nil && c.allowed(v.info.Name) {
			return c.present(w, v)
		}
	}
	return StatusOK
}

// present raises w's volume's fence to w's token; a token older than the
// fence is answered StatusFenced.
func (c *conn) present(w *window, v *volume) Status {
	ok, err := c.s.Store.raiseFence(v, w.fence)
	switch {
	case err != nil:
		c.s.log().Error("saving a volume's fencing token", "volume", v.info.Name, "err", err)
		return StatusNoMemory
	case !ok:
		return StatusFenced
	}
	return StatusOK
}

func (c *conn) unbind(h *ReqHeader) Status {
	if _, ok := c.windows[h.Window]; !ok {
		return StatusNoWindow
	}
	delete(c.windows, h.Window)
	c.last, c.lastKey = nil, 0
	return StatusOK
}

// authorise checks that the request's window covers n bytes at off of
// volume vol with access, and that the volume with that id now is one the
// connection's grant reaches. On StatusOK the window is c.last and its
// volume c.last.v. A write's token is checked here and again, atomically
// with the write, by Store.fenced.
func (c *conn) authorise(h *ReqHeader, vol uint16, off, n uint64, access uint32) Status {
	w := c.last
	if w == nil || c.lastKey != h.Window {
		// Window 0 is never bound: a request without one finds nothing.
		if w = c.windows[h.Window]; w == nil {
			return StatusNoWindow
		}
		c.last, c.lastKey = w, h.Window
	}
	if w.vol != vol || w.access&access != access || off < w.start {
		return StatusNoWindow
	}
	// An open-ended window leaves the range to the volume's own check.
	if w.end != math.MaxUint64 && (off > w.end || n > w.end-off) {
		return StatusNoWindow
	}
	if w.v == nil || w.v.deleted.Load() {
		v, err := c.s.Store.volume(vol)
		if err != nil {
			w.v = nil
			return StatusNoVolume
		}
		if !c.allowed(v.info.Name) {
			return StatusUnauthorised
		}
		w.v = v
		if w.fence != 0 && w.access&AccessWrite != 0 {
			// Bound before the volume existed: present the token now.
			if st := c.present(w, v); st != StatusOK && access&AccessWrite != 0 {
				return st
			}
		}
	}
	if access&AccessWrite != 0 && w.fence < w.v.fence.Load() {
		return StatusFenced
	}
	return StatusOK
}

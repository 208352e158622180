package fs

import (
	"context"
	"hash/maphash"
	"slices"
	"sort"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Directory listings.
//
// A listing's offsets are cookies derived from each name, not positions:
// a reader that goes on from an offset after the directory changed still
// finds every entry that was there all along (a removal would shift every
// later position, and `rm -r` removes while it reads). The listing is in
// cookie order; "." and ".." come first.
//
// The kernel is told that OPENDIR is not implemented (where it allows
// that: FUSE_NO_OPENDIR_SUPPORT, Linux 5.1), so it sends no OPENDIR and no
// RELEASEDIR at all: a third of dbench's requests. It then reads listings
// with no handle, and keeps them in its page cache as it does for
// FOPEN_CACHE_DIR|FOPEN_KEEP_CACHE (see OpendirHandle). Each such read is
// served by a handle made for it alone, so the listing it reads from is
// kept per directory (dirLists) rather than made again for each read of a
// large directory.

// Cookies of "." and ".."; a name's cookie is above them.
const (
	dotCookie    = 1
	dotDotCookie = 2
	firstCookie  = 3
)

// cookieOrder gives each entry of list (names, no "." or "..") its cookie
// and sorts list by it. Two names whose hashes collide take consecutive
// cookies in name order, so cookies are unique within a listing; the
// later one's cookie can move when the other goes, so a reader stopped
// exactly between them could miss it (2^-62 per pair of names).
func cookieOrder(seed maphash.Seed, list []fuse.DirEntry) {
	for i := range list {
		list[i].Off = firstCookie + maphash.String(seed, list[i].Name)>>2
	}
	slices.SortFunc(list, func(a, b fuse.DirEntry) int {
		if a.Off != b.Off {
			if a.Off < b.Off {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	for i := 1; i < len(list); i++ {
		if list[i].Off <= list[i-1].Off {
			list[i].Off = list[i-1].Off + 1
		}
	}
}

// dots starts the listing of directory self, with parent as its "..",
// and room for names more entries. "." and "..": ls -a and programs that
// count entries expect them; the kernel resolves them itself, so they
// need no Lookup.
func dots(self, parent uint64, names int) []fuse.DirEntry {
	return append(make([]fuse.DirEntry, 0, 2+names),
		fuse.DirEntry{Name: ".", Ino: self, Mode: syscall.S_IFDIR, Off: dotCookie},
		fuse.DirEntry{Name: "..", Ino: parent, Mode: syscall.S_IFDIR, Off: dotDotCookie})
}

// dirListing is directory ino's listing at version ver (inode.listVer)
// with parent as its "..".
type dirListing struct {
	ino, ver, parent uint64
	ents             []fuse.DirEntry
}

// dirLists keeps the listings last read, one slot per ino modulo its size.
type dirLists [64]atomic.Pointer[dirListing]

// listing returns directory n's entries in cookie order, "." and ".."
// first.
func (n *node) listing() ([]fuse.DirEntry, syscall.Errno) {
	f := n.f
	f.mu.RLock()
	defer f.mu.RUnlock()
	d, e := n.dir()
	if e != 0 {
		return nil, e
	}
	slot := &f.lists[n.ino%uint64(len(f.lists))]
	if l := slot.Load(); l != nil && l.ino == n.ino && l.ver == d.listVer && l.parent == d.Parent {
		return l.ents, 0
	}
	parent := d.Parent
	if n.ino == rootIno {
		parent = rootIno // the mount's parent is not ours to know; ls shows the root's own
	}
	ents := dots(n.ino, parent, len(d.Entries)+1)
	for name, ino := range d.Entries {
		if c := f.inodes[ino]; c != nil {
			ents = append(ents, fuse.DirEntry{Name: name, Ino: ino, Mode: c.Mode})
		}
	}
	if n.ino == rootIno {
		ents = append(ents, fuse.DirEntry{Name: volumesName, Ino: volumesIno, Mode: syscall.S_IFDIR})
	}
	cookieOrder(f.seed, ents[2:])
	// Stored under the read lock: a change, which bumps listVer, waits
	// for it, so what is stored is the listing of ver.
	slot.Store(&dirListing{ino: n.ino, ver: d.listVer, parent: d.Parent, ents: ents})
	return ents, 0
}

// OpendirHandle serves OPENDIR where the kernel still sends it: a handle
// whose listing the kernel keeps in its page cache from one opendir to the
// next (FOPEN_CACHE_DIR|FOPEN_KEEP_CACHE), so a listing is asked for once
// per change of the directory, not once per opendir. The kernel drops the
// cached listing itself when it changes the directory (create, link,
// unlink, rmdir, rename into or out of it); the one change it cannot see
// is a moved directory's "..", which Rename invalidates. Every change to
// the tree comes through this mount (the lease makes it the only writer),
// so nothing else can leave a listing stale.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{list: n.listing}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle reads a listing in cookie order from the offset it is given;
// go-fuse serialises the calls on one handle.
type dirHandle struct {
	list func() ([]fuse.DirEntry, syscall.Errno)
	ents []fuse.DirEntry // read on first use ("." at least); shared, not to be changed
	next int
}

var (
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*volumesDir)(nil)
	_ gofs.FileReaddirenter   = (*dirHandle)(nil)
	_ gofs.FileSeekdirer      = (*dirHandle)(nil)
	_ gofs.FileReleasedirer   = (*dirHandle)(nil)
)

func (h *dirHandle) load() syscall.Errno {
	if h.ents == nil {
		ents, e := h.list()
		if e != 0 {
			return e
		}
		h.ents = ents
	}
	return 0
}

func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if e := h.load(); e != 0 || h.next >= len(h.ents) {
		return nil, e
	}
	de := h.ents[h.next] // a copy: go-fuse may change what it is given
	h.next++
	return &de, 0
}

// Seekdir goes on after the entry whose cookie is off, or where it was.
func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if e := h.load(); e != 0 {
		return e
	}
	h.next = sort.Search(len(h.ents), func(i int) bool { return h.ents[i].Off > off })
	return 0
}

func (h *dirHandle) Releasedir(context.Context, uint32) {}

// rawFS is go-fuse's node bridge with directories read without OPENDIR
// (above) and the set-ID bits cleared as the kernel asks (killpriv.go).
type rawFS struct {
	fuse.RawFileSystem
	noOpendir bool
	// opendirs counts the OPENDIRs the kernel sent, getxattrs the
	// GETXATTRs.
	opendirs, getxattrs atomic.Uint64
}

func (r *rawFS) Init(s *fuse.Server) {
	r.noOpendir = s.KernelSettings().Flags&fuse.CAP_NO_OPENDIR_SUPPORT != 0
	r.RawFileSystem.Init(s)
}

// OpenDir answers ENOSYS once: from then on the kernel opens directories
// itself.
func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.opendirs.Add(1)
	if r.noOpendir {
		return fuse.ENOSYS
	}
	return r.RawFileSystem.OpenDir(cancel, in, out)
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, false)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, true)
}

// readDir serves a read of a listing; one without a handle (Fh 0: the
// kernel did not open the directory) through a handle of its own.
func (r *rawFS) readDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	read := r.RawFileSystem.ReadDir
	if plus {
		read = r.RawFileSystem.ReadDirPlus
	}
	if in.Fh != 0 {
		return read(cancel, in, out)
	}
	var open fuse.OpenOut
	if st := r.RawFileSystem.OpenDir(cancel, &fuse.OpenIn{InHeader: in.InHeader, Flags: in.Flags}, &open); !st.Ok() {
		return st
	}
	own := *in
	own.Fh = open.Fh
	st := read(cancel, &own, out)
	r.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: in.InHeader, Fh: open.Fh})
	return st
}

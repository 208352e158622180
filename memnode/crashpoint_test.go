package memnode

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// Crash-point testing of the persistent store, after CrashMonkey and ALICE:
// a workload runs on a disk that records every operation the store makes
// (writes, truncations, holes, creates, renames, removes, fdatasyncs,
// directory syncs) together with the workload's own marks (an operation
// issued, an operation acknowledged). For a crash after any prefix of that
// record, the test builds the directories a crash there could leave, opens
// a store on each, and checks it against what had been acknowledged.
//
// What a crash may leave: an operation followed by a barrier that covers it
// (an fdatasync of its file for data, a sync of the directory for names) is
// there. Of the rest, names change in order (a journaling filesystem
// commits them so) up to any point, and each data write independently may
// or may not have reached the disk, the last one possibly torn. Every
// prefix is built with none of them, with all of them, with all and the
// last write torn, and with random choices.

var (
	crashPoints   = flag.Int("crashpoints", 0, "crash points the crash-point test explores (default 150, 60 under -race; -1: every point)")
	crashVariants = flag.Int("crashvariants", 2, "random states built per crash point, beyond none, all and torn")
)

type fsOpKind uint8

const (
	fsCreate   fsOpKind = iota // name: a new, empty file
	fsTruncate                 // ino to size off
	fsWrite                    // data at off of ino
	fsPunch                    // n bytes at off of ino read as zeroes
	fsRename                   // name becomes name2, replacing it
	fsRemove                   // name
	fsDatasync                 // ino's data so far is durable
	fsSyncDir                  // every name change so far is durable
	fsMark                     // the workload's event
)

type fsOp struct {
	kind        fsOpKind
	ino         int
	name, name2 string
	off, n      int64
	data        []byte
	event       int
}

// names reports whether the op changes the directory's names.
func (o *fsOp) names() bool {
	return o.kind == fsCreate || o.kind == fsRename || o.kind == fsRemove
}

// changesData reports whether the op changes a file's bytes or size.
func (o *fsOp) changesData() bool {
	return o.kind == fsTruncate || o.kind == fsWrite || o.kind == fsPunch
}

// recorder is a disk that does everything on the operating system's and
// records it. One lock orders the operations as the record does.
type recorder struct {
	real disk

	mu     sync.Mutex
	ops    []fsOp
	inodes map[string]int
	next   int
}

func newRecorder() *recorder { return &recorder{real: osDisk{}, inodes: map[string]int{}} }

func (r *recorder) record(o fsOp) int {
	r.ops = append(r.ops, o)
	return len(r.ops) - 1
}

// mark records a workload event and returns its place in the record.
func (r *recorder) mark(event int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.record(fsOp{kind: fsMark, event: event})
}

func (r *recorder) OpenFile(name string, flag int) (diskFile, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := r.real.OpenFile(name, flag)
	if err != nil {
		return nil, err
	}
	base := filepath.Base(name)
	ino, ok := r.inodes[base]
	if !ok {
		r.next++
		ino = r.next
		r.inodes[base] = ino
		r.record(fsOp{kind: fsCreate, ino: ino, name: base})
	}
	if flag&os.O_TRUNC != 0 {
		r.record(fsOp{kind: fsTruncate, ino: ino})
	}
	return &recFile{diskFile: f, r: r, ino: ino}, nil
}

func (r *recorder) ReadFile(name string) ([]byte, error)  { return r.real.ReadFile(name) }
func (r *recorder) MkdirAll(dir string) error             { return r.real.MkdirAll(dir) }
func (r *recorder) Names(dir string) ([]string, error)    { return r.real.Names(dir) }
func (r *recorder) Stat(name string) (os.FileInfo, error) { return r.real.Stat(name) }

func (r *recorder) Remove(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.real.Remove(name); err != nil {
		return err
	}
	base := filepath.Base(name)
	delete(r.inodes, base)
	r.record(fsOp{kind: fsRemove, name: base})
	return nil
}

func (r *recorder) Rename(oldname, newname string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.real.Rename(oldname, newname); err != nil {
		return err
	}
	from, to := filepath.Base(oldname), filepath.Base(newname)
	r.inodes[to] = r.inodes[from]
	delete(r.inodes, from)
	r.record(fsOp{kind: fsRename, name: from, name2: to})
	return nil
}

func (r *recorder) Truncate(name string, size int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.real.Truncate(name, size); err != nil {
		return err
	}
	r.record(fsOp{kind: fsTruncate, ino: r.inodes[filepath.Base(name)], off: size})
	return nil
}

func (r *recorder) SyncDir(dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.real.SyncDir(dir); err != nil {
		return err
	}
	r.record(fsOp{kind: fsSyncDir})
	return nil
}

type recFile struct {
	diskFile
	r   *recorder
	ino int
	pos int64
}

func (f *recFile) Write(p []byte) (int, error) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	n, err := f.diskFile.Write(p)
	f.r.record(fsOp{kind: fsWrite, ino: f.ino, off: f.pos, data: bytes.Clone(p[:n])})
	f.pos += int64(n)
	return n, err
}

func (f *recFile) WriteAt(p []byte, off int64) (int, error) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	n, err := f.diskFile.WriteAt(p, off)
	f.r.record(fsOp{kind: fsWrite, ino: f.ino, off: off, data: bytes.Clone(p[:n])})
	return n, err
}

func (f *recFile) PunchHole(off, n int64) error {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	if err := f.diskFile.PunchHole(off, n); err != nil {
		return err
	}
	f.r.record(fsOp{kind: fsPunch, ino: f.ino, off: off, n: n})
	return nil
}

func (f *recFile) Datasync() error { return f.barrier(f.diskFile.Datasync) }
func (f *recFile) Sync() error     { return f.barrier(f.diskFile.Sync) }

func (f *recFile) barrier(sync func() error) error {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	if err := sync(); err != nil {
		return err
	}
	f.r.record(fsOp{kind: fsDatasync, ino: f.ino})
	return nil
}

// crashModel builds the directories a crash could leave from a record.
type crashModel struct {
	ops []fsOp
	// cover[j] is the first barrier after op j that makes it durable
	// (len(ops) when none does).
	cover []int
}

func newCrashModel(ops []fsOp) *crashModel {
	m := &crashModel{ops: ops, cover: make([]int, len(ops))}
	lastSyncDir := len(ops)
	lastSync := map[int]int{} // ino → the next fdatasync of it, scanning backwards
	for j := len(ops) - 1; j >= 0; j-- {
		o := &ops[j]
		m.cover[j] = len(ops)
		switch {
		case o.names():
			m.cover[j] = lastSyncDir
		case o.changesData():
			if b, ok := lastSync[o.ino]; ok {
				m.cover[j] = b
			}
		}
		switch o.kind {
		case fsSyncDir:
			lastSyncDir = j
		case fsDatasync:
			lastSync[o.ino] = j
		}
	}
	return m
}

// durable reports whether op j is on disk in a crash after the first at ops.
func (m *crashModel) durable(j, at int) bool { return m.cover[j] < at }

// crashChoice says which of the operations that need not be on disk are.
type crashChoice struct {
	name    string
	namesTo int              // name changes before this index are kept
	keep    func(j int) bool // data changes
	torn    int              // this write is cut in half (-1: none)
}

// build returns the files, by name, a crash after at ops leaves under c.
func (m *crashModel) build(at int, c crashChoice) map[string][]byte {
	names := map[string]int{}
	files := map[int][]byte{}
	for j := range at {
		o := &m.ops[j]
		if !m.durable(j, at) {
			if o.names() && j >= c.namesTo || o.changesData() && !c.keep(j) {
				continue
			}
		}
		switch o.kind {
		case fsCreate:
			names[o.name] = o.ino
			files[o.ino] = nil
		case fsTruncate:
			b := files[o.ino]
			if int64(len(b)) > o.off {
				files[o.ino] = b[:o.off]
			} else {
				files[o.ino] = append(b, make([]byte, o.off-int64(len(b)))...)
			}
		case fsWrite:
			d := o.data
			if j == c.torn {
				d = d[:len(d)/2]
			}
			b := files[o.ino]
			if end := o.off + int64(len(d)); end > int64(len(b)) {
				b = append(b, make([]byte, end-int64(len(b)))...)
			}
			copy(b[o.off:], d)
			files[o.ino] = b
		case fsPunch:
			b := files[o.ino]
			if o.off < int64(len(b)) {
				clear(b[o.off:min(int64(len(b)), o.off+o.n)])
			}
		case fsRename:
			if ino, ok := names[o.name]; ok {
				names[o.name2] = ino
				delete(names, o.name)
			}
		case fsRemove:
			delete(names, o.name)
		}
	}
	out := make(map[string][]byte, len(names))
	for n, ino := range names {
		out[n] = files[ino]
	}
	return out
}

// choices are the states built for a crash after at ops.
func (m *crashModel) choices(at int, rng *rand.Rand, random int) []crashChoice {
	none := func(int) bool { return false }
	all := func(int) bool { return true }
	lastWrite := -1
	var pendingNames []int
	for j := range at {
		if m.durable(j, at) {
			continue
		}
		switch {
		case m.ops[j].kind == fsWrite:
			lastWrite = j
		case m.ops[j].names():
			pendingNames = append(pendingNames, j)
		}
	}
	cs := []crashChoice{
		{name: "nothing pending", namesTo: 0, keep: none, torn: -1},
		{name: "everything", namesTo: at, keep: all, torn: -1},
	}
	if lastWrite >= 0 {
		cs = append(cs, crashChoice{name: fmt.Sprintf("everything, op %d torn", lastWrite), namesTo: at, keep: all, torn: lastWrite})
	}
	for k := range random {
		seed := rng.Uint64()
		keep := func(j int) bool { return rand.New(rand.NewPCG(seed, uint64(j))).IntN(2) == 0 }
		namesTo := at
		if len(pendingNames) > 0 {
			namesTo = pendingNames[rng.IntN(len(pendingNames))] + rng.IntN(2)
		}
		torn := -1
		if lastWrite >= 0 && keep(lastWrite) && rng.IntN(2) == 0 {
			torn = lastWrite
		}
		cs = append(cs, crashChoice{name: fmt.Sprintf("random %d", k), namesTo: namesTo, keep: keep, torn: torn})
	}
	return cs
}

// The workload's events and what a recovered store must show of them.

type crashEventKind uint8

const (
	evCreate crashEventKind = iota
	evDelete
	evWrite // data nil: a trim
	evResize
	evFence
)

type crashEvent struct {
	kind       crashEventKind
	vol        string
	page       uint64
	data       []byte
	n          uint64 // size, or token
	issue, ack int    // places in the record; ack -1 until acknowledged
}

type crashWorkload struct {
	r      *recorder
	events []*crashEvent
}

func (w *crashWorkload) do(t *testing.T, e *crashEvent, op func() error) {
	t.Helper()
	e.ack = -1
	w.events = append(w.events, e)
	e.issue = w.r.mark(len(w.events) - 1)
	require.NoError(t, op())
	e.ack = w.r.mark(len(w.events) - 1)
}

// crashPage is the content of the nth write of the workload.
func crashPage(n int) []byte {
	p := pattern(byte(n), pageid.Size)
	binary.LittleEndian.PutUint64(p, uint64(n)+1)
	return p
}

// run is the workload: volumes created, written, trimmed, resized, fenced
// and deleted (a deleted volume's id re-used), with explicit checkpoints
// and, through a small log limit, background ones.
func (w *crashWorkload) run(t *testing.T, s *Store, steps int) {
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 2 * ChunkSize
	vols := []string{"a", "b"}
	sizes := map[string]uint64{"a": size, "b": size}
	create := func(name string) {
		w.do(t, &crashEvent{kind: evCreate, vol: name, n: size}, func() error {
			_, err := s.Create(name, size)
			return err
		})
		sizes[name] = size
	}
	for _, v := range vols {
		create(v)
	}
	id := func(name string) uint16 {
		v, err := s.Open(name)
		require.NoError(t, err)
		return v.ID
	}
	var token uint64
	for step := range steps {
		name := vols[rng.IntN(len(vols))]
		page := rng.Uint64N(sizes[name] / pageid.Size)
		switch x := rng.IntN(100); {
		case step == steps/3: // b goes, c takes its id
			w.do(t, &crashEvent{kind: evDelete, vol: "b"}, func() error { return s.Delete("b") })
			vols = []string{"a"}
			create("c")
			vols = append(vols, "c")
		case step == steps/2:
			sizes["a"] += ChunkSize
			w.do(t, &crashEvent{kind: evResize, vol: "a", n: sizes["a"]}, func() error {
				_, err := s.Resize("a", sizes["a"])
				return err
			})
		case x < 4:
			// Writes go on while a checkpoint runs: its page files, the
			// new segment and the checkpoint file interleave with them.
			done := make(chan error, 1)
			go func() { done <- s.Checkpoint() }()
			for j := range 6 {
				data := crashPage(len(w.events))
				p := (page + uint64(j)) % (sizes[name] / pageid.Size)
				w.do(t, &crashEvent{kind: evWrite, vol: name, page: p, data: data}, func() error {
					return s.WriteAt(id(name), p*pageid.Size, data)
				})
			}
			require.NoError(t, <-done)
		case x < 8:
			token++
			w.do(t, &crashEvent{kind: evFence, vol: name, n: token}, func() error {
				s.mu.Lock()
				v := s.byName[name]
				s.mu.Unlock()
				_, err := s.raiseFence(v, token)
				return err
			})
		case x < 16:
			w.do(t, &crashEvent{kind: evWrite, vol: name, page: page}, func() error {
				return s.Trim(id(name), page*pageid.Size, pageid.Size)
			})
		default:
			data := crashPage(len(w.events))
			w.do(t, &crashEvent{kind: evWrite, vol: name, page: page, data: data}, func() error {
				return s.WriteAt(id(name), page*pageid.Size, data)
			})
		}
	}
}

// check compares a store recovered from a crash after at ops with the
// events: whatever was acknowledged is there, and nothing is there that
// was not written.
func (w *crashWorkload) check(s *Store, at int) error {
	type volState struct {
		exists, mayExist bool
		sizes            map[uint64]bool
		minSize, token   uint64
		pages            map[uint64][]*crashEvent
	}
	st := map[string]*volState{}
	for _, e := range w.events {
		if e.issue >= at {
			break
		}
		acked := e.ack >= 0 && e.ack < at
		v := st[e.vol]
		if v == nil {
			v = &volState{sizes: map[uint64]bool{}, pages: map[uint64][]*crashEvent{}}
			st[e.vol] = v
		}
		switch e.kind {
		case evCreate:
			v.mayExist, v.exists = true, acked
			v.sizes[e.n] = true
			v.minSize = 0
			if acked {
				v.minSize = e.n
			}
		case evDelete:
			v.exists = false
			v.mayExist = !acked
		case evResize:
			v.sizes[e.n] = true
			if acked {
				v.minSize = e.n
			}
		case evFence:
			if acked {
				v.token = e.n
			}
		case evWrite:
			v.pages[e.page] = append(v.pages[e.page], e)
		}
	}
	got := map[string]pageid.VolumeInfo{}
	for _, info := range s.List() {
		got[info.Name] = info
	}
	for name, info := range got {
		v := st[name]
		if v == nil || !v.mayExist {
			return fmt.Errorf("volume %q is there, never created or its delete acknowledged", name)
		}
		if !v.sizes[info.Size] || info.Size < v.minSize {
			return fmt.Errorf("volume %q has %d bytes; sizes issued %v, acknowledged %d", name, info.Size, v.sizes, v.minSize)
		}
		if tok, err := s.Fence(info.ID); err != nil || tok < v.token {
			return fmt.Errorf("volume %q: fencing token %d (%v), %d acknowledged", name, tok, err, v.token)
		}
		buf := make([]byte, pageid.Size)
		zero := make([]byte, pageid.Size)
		for page := range info.Size / pageid.Size {
			if err := s.ReadAt(info.ID, page*pageid.Size, buf); err != nil {
				return err
			}
			hist := v.pages[page]
			allowed := hist
			ackedAt := -1
			for i, e := range hist {
				if e.ack >= 0 && e.ack < at {
					ackedAt = i
				}
			}
			if ackedAt >= 0 {
				allowed = hist[ackedAt:]
			}
			ok := ackedAt < 0 && bytes.Equal(buf, zero)
			for _, e := range allowed {
				ok = ok || bytes.Equal(buf, e.data) || e.data == nil && bytes.Equal(buf, zero)
			}
			if !ok {
				return fmt.Errorf("volume %q page %d holds %x…, not what was written (%d writes issued, acknowledged up to #%d)",
					name, page, buf[:8], len(hist), ackedAt)
			}
		}
	}
	for name, v := range st {
		if _, ok := got[name]; v.exists && !ok {
			return fmt.Errorf("volume %q is gone; its create was acknowledged", name)
		}
	}
	return s.Check()
}

// TestCrashPoints runs the workload on a recording disk and recovers a
// store from every state a crash could leave at each explored point.
// -crashpoints and -crashvariants run it longer.
func TestCrashPoints(t *testing.T) {
	steps, points := 240, 150
	if raceEnabled {
		steps, points = 120, 60
	}
	if testing.Short() {
		steps = 60
	}
	switch {
	case *crashPoints > 0:
		points = *crashPoints
	case *crashPoints < 0:
		points = 0
	}
	r := newRecorder()
	dir := t.TempDir()
	s, err := openPersistent(r, dir, 0, nil)
	require.NoError(t, err)
	s.SetLogLimit(96 << 10) // checkpoints in the background too
	w := &crashWorkload{r: r}
	w.run(t, s, steps)
	crash(s)

	r.mu.Lock()
	m := newCrashModel(r.ops)
	r.mu.Unlock()
	all := len(m.ops) + 1
	stride := 1
	if points > 0 && all > points {
		stride = all / points
	}
	rng := rand.New(rand.NewPCG(3, 4))
	states, syncs := 0, 0
	for _, o := range m.ops {
		if o.kind == fsDatasync || o.kind == fsSyncDir {
			syncs++
		}
	}
	for at := 0; at < all; at += stride {
		for _, c := range m.choices(at, rng, *crashVariants) {
			states++
			if err := recoverCrash(t, m.build(at, c), func(s *Store) error { return w.check(s, at) }); err != nil {
				t.Fatalf("crash after op %d of %d (%s): %v", at, len(m.ops), c.name, err)
			}
		}
	}
	t.Logf("%d operations recorded (%d syncs), %d crash points explored, %d states recovered and checked",
		len(m.ops), syncs, (all+stride-1)/stride, states)
}

// recoverCrash writes files into a new directory, opens a store there and
// checks it.
func recoverCrash(t *testing.T, files map[string][]byte, check func(*Store) error) error {
	dir, err := os.MkdirTemp(t.TempDir(), "crash")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			return err
		}
	}
	s, err := OpenPersistent(dir, 0)
	if err != nil {
		return fmt.Errorf("recovery refused the state: %w", err)
	}
	defer crash(s)
	return check(s)
}

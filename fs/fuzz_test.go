package fs

import (
	"bytes"
	"encoding/json"
	"syscall"
	"testing"
)

// FuzzSnapshot: any bytes in the metadata volume decode to a checked tree
// or an error, never a panic or a tree the model cannot walk.
func FuzzSnapshot(f *testing.F) {
	good := snapshot{Version: snapshotVersion, NextIno: 20, Inodes: []*inode{
		{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Parent: rootIno}, Entries: map[string]uint64{"d": 16, "f": 17}},
		{attrs: attrs{Ino: 16, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
		{attrs: attrs{Ino: 17, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Vol: "fs.pd3.17", Size: 5}},
	}}
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(&good); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		// What was accepted is written back as it is read again.
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("encoding an accepted snapshot: %v", err)
		}
		if _, err := decodeSnapshot(again); err != nil {
			t.Fatalf("an accepted snapshot, written again, is refused: %v", err)
		}
		byIno := map[uint64]*inode{}
		for _, n := range s.Inodes {
			byIno[n.Ino] = n
		}
		for _, n := range s.Inodes {
			if !n.isDir() {
				continue
			}
			for p, i := n, 0; p.Ino != rootIno; p, i = byIno[p.Parent], i+1 {
				if i > len(s.Inodes) {
					t.Fatalf("directory %d: parent cycle accepted", n.Ino)
				}
			}
		}
	})
}

// FuzzJournalRecord: any payload that passed its checksum replays onto a
// tree as a checked tree or an error, never a panic.
func FuzzJournalRecord(f *testing.F) {
	good := record{NextIno: 21,
		Inodes:  []attrs{{Ino: 20, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: 16}},
		Entries: []dentry{{Dir: 16, Name: "sub", Ino: 20}, {Dir: rootIno, Name: "f", Ino: 0}},
		Freed:   []uint64{17},
	}
	b, err := json.Marshal(&good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"Entries":[{"Dir":1,"Name":"d","Ino":1}]}`))
	f.Add([]byte(`{"Freed":[1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &snapshot{Version: snapshotVersion, NextIno: 20, Inodes: []*inode{
			{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Parent: rootIno}, Entries: map[string]uint64{"d": 16, "f": 17}},
			{attrs: attrs{Ino: 16, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
			{attrs: attrs{Ino: 17, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Vol: "fs.pd3.17", Size: 5}},
		}}
		if err := replay(s, [][]byte{data}); err != nil {
			return
		}
		byIno := map[uint64]*inode{}
		for _, n := range s.Inodes {
			byIno[n.Ino] = n
		}
		if err := check(byIno, s.NextIno); err != nil {
			t.Fatalf("replay accepted a tree that fails its check: %v", err)
		}
	})
}

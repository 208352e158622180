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
		{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Parent: rootIno, Entries: map[string]uint64{"d": 16, "f": 17}},
		{Ino: 16, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno, Entries: map[string]uint64{}},
		{Ino: 17, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Vol: "fs.pd3.17", Size: 5},
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

package nbd

import (
	"encoding/binary"
	"io"
	"log/slog"
	"testing"

	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

func fuzzRequest(cmd nbdproto.Cmd, flags nbdproto.CmdFlags, off uint64, n uint32) []byte {
	return (&nbdproto.Request{Cmd: cmd, Flags: flags, Cookie: uint64(cmd) + 1, Offset: off, Length: n}).Append(nil)
}

// FuzzServerStream: any byte stream from a client, handshake and
// transmission alike, gets answers or a hang-up, never a crash or a
// stall, and leaves the page cache consistent.
func FuzzServerStream(f *testing.F) {
	flags := binary.BigEndian.AppendUint32(nil, uint32(nbdproto.ClientFixedNewstyle|nbdproto.ClientNoZeroes))
	goDisk0 := binary.BigEndian.AppendUint32(nil, 5)
	goDisk0 = binary.BigEndian.AppendUint16(append(goDisk0, "disk0"...), 0)
	meta := binary.BigEndian.AppendUint32(nil, 5)
	meta = append(meta, "disk0"...)
	meta = binary.BigEndian.AppendUint32(meta, 1)
	meta = binary.BigEndian.AppendUint32(meta, uint32(len(nbdproto.MetaBaseAllocation)))
	meta = append(meta, nbdproto.MetaBaseAllocation...)
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	f.Add(cat(flags, nbdproto.AppendOption(nil, nbdproto.OptGo, goDisk0),
		fuzzRequest(nbdproto.CmdRead, 0, 0, 4096),
		fuzzRequest(nbdproto.CmdWrite, nbdproto.CmdFlagFUA, 4000, 200), make([]byte, 200),
		fuzzRequest(nbdproto.CmdTrim, 0, 8192, 8192),
		fuzzRequest(nbdproto.CmdWriteZeroes, nbdproto.CmdFlagNoHole, 100, 5000),
		fuzzRequest(nbdproto.CmdCache, 0, 0, 65536),
		fuzzRequest(nbdproto.CmdFlush, 0, 0, 0),
		fuzzRequest(nbdproto.CmdDisc, 0, 0, 0)))
	f.Add(cat(flags, nbdproto.AppendOption(nil, nbdproto.OptStructuredReply, nil), nbdproto.AppendOption(nil, nbdproto.OptSetMetaContext, meta),
		nbdproto.AppendOption(nil, nbdproto.OptList, nil), nbdproto.AppendOption(nil, nbdproto.OptInfo, goDisk0), nbdproto.AppendOption(nil, nbdproto.OptGo, goDisk0),
		fuzzRequest(nbdproto.CmdBlockStatus, 0, 0, 1<<20),
		fuzzRequest(nbdproto.CmdRead, nbdproto.CmdFlagDF, 4095, 2)))
	f.Add(cat(flags, nbdproto.AppendOption(nil, nbdproto.OptExportName, nil), fuzzRequest(nbdproto.CmdRead, 0, 1<<20-1, 1)))
	f.Add(cat(flags, nbdproto.AppendOption(nil, nbdproto.OptExportName, []byte("ro")), fuzzRequest(nbdproto.CmdWrite, 0, 0, 4), []byte{1, 2, 3, 4}))
	f.Add(cat(flags, nbdproto.AppendOption(nil, nbdproto.OptAbort, nil)))

	st, err := pagestore.New(pagestore.NewMemRemote(), pagestore.Options{CacheBytes: 16 * pageid.Size})
	if err != nil {
		f.Fatal(err)
	}
	srv := &Server{Backend: st, MaxRequest: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for i, name := range []string{"disk0", "ro"} {
		v := pageid.VolumeInfo{ID: uint16(i + 1), Name: name, Size: 1 << 20}
		st.AddVolume(v)
		srv.Exports = append(srv.Exports, Export{Name: name, Volume: v.ID, Size: v.Size, ReadOnly: name == "ro"})
	}
	testnet.FuzzServer(f, srv, st.Check)
}

package nbdclient

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeServer accepts one connection and writes reply after the client's
// first bytes, then closes.
func fakeServer(t *testing.T, reply []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.Write(reply)
		buf := make([]byte, 1024)
		nc.Read(buf)
	}()
	return ln.Addr().String()
}

// A peer's lengths and magics are checked before they are believed: a
// wrong or hostile server gets a clear error, not a 4 GiB allocation.
func TestHandshakeRefusesWhatIsNotNBD(t *testing.T) {
	greeting := append([]byte("NBDMAGICIHAVEOPT"), 0, 1)
	optReply := func(magic uint64, length uint32) []byte {
		h := binary.BigEndian.AppendUint64(nil, magic)
		h = binary.BigEndian.AppendUint32(h, 7)
		h = binary.BigEndian.AppendUint32(h, 3) // NBD_REP_INFO
		return binary.BigEndian.AppendUint32(h, length)
	}
	for _, tc := range []struct {
		name, want string
		reply      []byte
	}{
		{"http server", "not an NBD server", []byte("HTTP/1.1 400 Bad Request\r\n\r\n")},
		{"huge option reply", "option reply of 4294967295 bytes", append(greeting, optReply(0x3e889045565a9, 0xffffffff)...)},
		{"bad reply magic", "option reply magic", append(greeting, optReply(0x1234, 8)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Dial(fakeServer(t, tc.reply), "disk0")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// Package nbdclient is a minimal synchronous NBD client: fixed-newstyle
// handshake with GO, then one request at a time with simple replies. The
// tests use it where a real client cannot be steered precisely, and the
// NBD benchmark for what fio's nbd engine cannot send (FUA). A test that
// pipelines requests negotiates what it needs (Options) and speaks the
// transmission phase itself over Conn.
package nbdclient

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/pd3-go/pd3/nbd/nbdproto"
)

// maxOptReply bounds an option reply's data; the longest this client asks
// for (NBD_REP_INFO, an error message) is far shorter.
const maxOptReply = 64 << 10

// Client is one NBD connection.
type Client struct {
	nc     net.Conn
	r      *bufio.Reader
	Size   uint64
	cookie uint64
}

// Options are what a client negotiates beyond the export.
type Options struct {
	// Structured asks for structured replies (NBD_OPT_STRUCTURED_REPLY);
	// the client's own Read does not understand them, so a client that
	// asks speaks the transmission phase itself (Conn).
	Structured bool
}

// Dial connects to export on addr.
func Dial(addr, export string) (*Client, error) {
	return DialOptions(addr, export, Options{})
}

// DialOptions connects to export on addr, negotiating opt first.
func DialOptions(addr, export string, opt Options) (*Client, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, r: bufio.NewReader(nc)}
	if err := c.handshake(export, opt); err != nil {
		nc.Close()
		return nil, fmt.Errorf("NBD handshake: %w", err)
	}
	return c, nil
}

// Conn is the connection and its buffered reader, for a caller that
// sends and reads the transmission phase itself (pipelined requests,
// structured replies). Such a caller must not use Read, Write or Flush.
func (c *Client) Conn() (net.Conn, *bufio.Reader) { return c.nc, c.r }

// optionReply reads one option reply.
func (c *Client) optionReply() (nbdproto.Rep, []byte, error) {
	var rh [nbdproto.OptReplyHeaderLen]byte
	if _, err := io.ReadFull(c.r, rh[:]); err != nil {
		return 0, nil, err
	}
	if m := binary.BigEndian.Uint64(rh[:]); m != nbdproto.MagicOptReply {
		return 0, nil, fmt.Errorf("option reply magic %#x, want %#x", m, nbdproto.MagicOptReply)
	}
	typ := nbdproto.Rep(binary.BigEndian.Uint32(rh[12:]))
	n := binary.BigEndian.Uint32(rh[16:])
	if n > maxOptReply {
		// The length comes from the peer: trust it only as far as
		// an option reply can reasonably go.
		return 0, nil, fmt.Errorf("option reply of %d bytes: more than %d", n, maxOptReply)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(c.r, data); err != nil {
		return 0, nil, err
	}
	return typ, data, nil
}

func (c *Client) handshake(export string, opt Options) error {
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.nc.SetDeadline(time.Time{})
	var greet [nbdproto.GreetingLen]byte
	if _, err := io.ReadFull(c.r, greet[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(greet[:]) != nbdproto.MagicInit || binary.BigEndian.Uint64(greet[8:]) != nbdproto.MagicOption {
		return fmt.Errorf("not an NBD server with fixed newstyle negotiation: greeting %q", greet[:16])
	}
	c.nc.Write(binary.BigEndian.AppendUint32(nil, uint32(nbdproto.ClientFixedNewstyle)))
	if opt.Structured {
		if _, err := c.nc.Write(nbdproto.AppendOption(nil, nbdproto.OptStructuredReply, nil)); err != nil {
			return err
		}
		typ, data, err := c.optionReply()
		if err != nil {
			return err
		}
		if typ != nbdproto.RepAck {
			return fmt.Errorf("server refused structured replies (%v): %s", typ, data)
		}
	}
	d := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	d = binary.BigEndian.AppendUint16(append(d, export...), 0)
	if _, err := c.nc.Write(nbdproto.AppendOption(nil, nbdproto.OptGo, d)); err != nil {
		return err
	}
	for {
		typ, data, err := c.optionReply()
		if err != nil {
			return err
		}
		switch {
		case typ == nbdproto.RepAck: // transmission starts
			return nil
		case typ == nbdproto.RepInfo && len(data) >= 12 && nbdproto.Info(binary.BigEndian.Uint16(data)) == nbdproto.InfoExport:
			c.Size = binary.BigEndian.Uint64(data[2:])
		case typ.IsError():
			return fmt.Errorf("server refused GO (%v): %s", typ, data)
		}
	}
}

// Close disconnects politely.
func (c *Client) Close() error {
	c.request(nbdproto.CmdDisc, 0, 0, nil)
	return c.nc.Close()
}

func (c *Client) request(typ nbdproto.Cmd, off uint64, n uint32, payload []byte) error {
	return c.requestFlags(0, typ, off, n, payload)
}

func (c *Client) requestFlags(flags nbdproto.CmdFlags, typ nbdproto.Cmd, off uint64, n uint32, payload []byte) error {
	c.cookie++
	r := nbdproto.Request{Flags: flags, Cmd: typ, Cookie: c.cookie, Offset: off, Length: n}
	_, err := c.nc.Write(append(r.Append(nil), payload...))
	return err
}

func (c *Client) reply(data []byte) error {
	var h [nbdproto.SimpleReplyLen]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return err
	}
	if m := binary.BigEndian.Uint32(h[:]); m != nbdproto.MagicSimpleReply {
		return fmt.Errorf("reply magic %#x, want a simple reply (%#x)", m, nbdproto.MagicSimpleReply)
	}
	if binary.BigEndian.Uint64(h[8:]) != c.cookie {
		return fmt.Errorf("reply for cookie %d, expected %d", binary.BigEndian.Uint64(h[8:]), c.cookie)
	}
	if e := nbdproto.Errno(binary.BigEndian.Uint32(h[4:])); e != 0 {
		return fmt.Errorf("NBD error %v", e)
	}
	if data != nil {
		_, err := io.ReadFull(c.r, data)
		return err
	}
	return nil
}

// Read reads len(p) bytes at off.
func (c *Client) Read(off uint64, p []byte) error {
	if err := c.request(nbdproto.CmdRead, off, uint32(len(p)), nil); err != nil {
		return err
	}
	return c.reply(p)
}

// Write writes p at off.
func (c *Client) Write(off uint64, p []byte) error {
	if err := c.request(nbdproto.CmdWrite, off, uint32(len(p)), p); err != nil {
		return err
	}
	return c.reply(nil)
}

// WriteFUA writes p at off with Force Unit Access: the reply comes once
// the write is durable.
func (c *Client) WriteFUA(off uint64, p []byte) error {
	if err := c.requestFlags(nbdproto.CmdFlagFUA, nbdproto.CmdWrite, off, uint32(len(p)), p); err != nil {
		return err
	}
	return c.reply(nil)
}

// Flush asks the server to make acknowledged writes durable.
func (c *Client) Flush() error {
	if err := c.request(nbdproto.CmdFlush, 0, 0, nil); err != nil {
		return err
	}
	return c.reply(nil)
}

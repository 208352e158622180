// Package nbdclient is a minimal synchronous NBD client: fixed-newstyle
// handshake with GO, then one request at a time with simple replies. The
// tests use it where a real client cannot be steered precisely, and the
// NBD benchmark for what fio's nbd engine cannot send (FUA).
package nbdclient

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

const (
	optReplyMagic = 0x3e889045565a9
	// maxOptReply bounds an option reply's data; the longest this client
	// asks for (NBD_REP_INFO, an error message) is far shorter.
	maxOptReply = 64 << 10
)

// Client is one NBD connection.
type Client struct {
	nc     net.Conn
	r      *bufio.Reader
	Size   uint64
	cookie uint64
}

// Dial connects to export on addr.
func Dial(addr, export string) (*Client, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, r: bufio.NewReader(nc)}
	if err := c.handshake(export); err != nil {
		nc.Close()
		return nil, fmt.Errorf("NBD handshake: %w", err)
	}
	return c, nil
}

func (c *Client) handshake(export string) error {
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.nc.SetDeadline(time.Time{})
	var greet [18]byte
	if _, err := io.ReadFull(c.r, greet[:]); err != nil {
		return err
	}
	if string(greet[:16]) != "NBDMAGICIHAVEOPT" {
		return fmt.Errorf("not an NBD server with fixed newstyle negotiation: greeting %q", greet[:16])
	}
	c.nc.Write(binary.BigEndian.AppendUint32(nil, 1)) // fixed newstyle
	d := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	d = binary.BigEndian.AppendUint16(append(d, export...), 0)
	h := binary.BigEndian.AppendUint64(nil, 0x49484156454F5054)
	h = binary.BigEndian.AppendUint32(h, 7) // GO
	h = binary.BigEndian.AppendUint32(h, uint32(len(d)))
	if _, err := c.nc.Write(append(h, d...)); err != nil {
		return err
	}
	for {
		var rh [20]byte
		if _, err := io.ReadFull(c.r, rh[:]); err != nil {
			return err
		}
		if m := binary.BigEndian.Uint64(rh[:]); m != optReplyMagic {
			return fmt.Errorf("option reply magic %#x, want %#x", m, uint64(optReplyMagic))
		}
		typ := binary.BigEndian.Uint32(rh[12:])
		n := binary.BigEndian.Uint32(rh[16:])
		if n > maxOptReply {
			// The length comes from the peer: trust it only as far as
			// an option reply can reasonably go.
			return fmt.Errorf("option reply of %d bytes: more than %d", n, maxOptReply)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return err
		}
		switch {
		case typ == 1: // ACK: transmission starts
			return nil
		case typ == 3 && len(data) >= 12 && binary.BigEndian.Uint16(data) == 0:
			c.Size = binary.BigEndian.Uint64(data[2:])
		case typ&(1<<31) != 0:
			return fmt.Errorf("server refused GO: %s", data)
		}
	}
}

// Close disconnects politely.
func (c *Client) Close() error {
	c.request(2, 0, 0, nil)
	return c.nc.Close()
}

func (c *Client) request(typ uint16, off uint64, n uint32, payload []byte) error {
	return c.requestFlags(0, typ, off, n, payload)
}

func (c *Client) requestFlags(flags, typ uint16, off uint64, n uint32, payload []byte) error {
	c.cookie++
	h := binary.BigEndian.AppendUint32(nil, 0x25609513)
	h = binary.BigEndian.AppendUint16(h, flags)
	h = binary.BigEndian.AppendUint16(h, typ)
	h = binary.BigEndian.AppendUint64(h, c.cookie)
	h = binary.BigEndian.AppendUint64(h, off)
	h = binary.BigEndian.AppendUint32(h, n)
	_, err := c.nc.Write(append(h, payload...))
	return err
}

func (c *Client) reply(data []byte) error {
	var h [16]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(h[8:]) != c.cookie {
		return fmt.Errorf("reply for cookie %d, expected %d", binary.BigEndian.Uint64(h[8:]), c.cookie)
	}
	if e := binary.BigEndian.Uint32(h[4:]); e != 0 {
		return fmt.Errorf("NBD error %d", e)
	}
	if data != nil {
		_, err := io.ReadFull(c.r, data)
		return err
	}
	return nil
}

// Read reads len(p) bytes at off.
func (c *Client) Read(off uint64, p []byte) error {
	if err := c.request(0, off, uint32(len(p)), nil); err != nil {
		return err
	}
	return c.reply(p)
}

// Write writes p at off.
func (c *Client) Write(off uint64, p []byte) error {
	if err := c.request(1, off, uint32(len(p)), p); err != nil {
		return err
	}
	return c.reply(nil)
}

// WriteFUA writes p at off with Force Unit Access: the reply comes once
// the write is durable.
func (c *Client) WriteFUA(off uint64, p []byte) error {
	const cmdFlagFUA = 1 << 0
	if err := c.requestFlags(cmdFlagFUA, 1, off, uint32(len(p)), p); err != nil {
		return err
	}
	return c.reply(nil)
}

// Flush asks the server to make acknowledged writes durable.
func (c *Client) Flush() error {
	if err := c.request(3, 0, 0, nil); err != nil {
		return err
	}
	return c.reply(nil)
}

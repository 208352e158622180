package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
)

// The negotiation phase: greeting, options, and the export the
// transmission phase serves.

// handshake runs fixed-newstyle negotiation; it reports whether the
// transmission phase should start.
func (c *conn) handshake() (bool, error) {
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:], nbdproto.MagicInit)
	binary.BigEndian.PutUint64(b[8:], nbdproto.MagicOption)
	binary.BigEndian.PutUint16(b[16:], uint16(nbdproto.FlagFixedNewstyle|nbdproto.FlagNoZeroes))
	if _, err := c.nc.Write(b[:]); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.r, cf[:]); err != nil {
		return false, err
	}
	flags := nbdproto.ClientFlags(binary.BigEndian.Uint32(cf[:]))
	if flags&^(nbdproto.ClientFixedNewstyle|nbdproto.ClientNoZeroes) != 0 {
		c.s.ProtocolViolations.Add(1)
		return false, fmt.Errorf("%w: unknown client flags %#x", errProtocol, flags)
	}
	c.noZeroes = flags&nbdproto.ClientNoZeroes != 0
	for {
		var h [16]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return false, err
		}
		if binary.BigEndian.Uint64(h[0:]) != nbdproto.MagicOption {
			c.s.ProtocolViolations.Add(1)
			return false, fmt.Errorf("%w: bad option magic", errProtocol)
		}
		opt := nbdproto.Opt(binary.BigEndian.Uint32(h[8:]))
		n := binary.BigEndian.Uint32(h[12:])
		if n > maxOptionLen {
			c.s.ProtocolViolations.Add(1)
			return false, fmt.Errorf("%w: option %v of %d bytes", errProtocol, opt, n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return false, err
		}
		done, err := c.option(opt, data)
		if err != nil || done {
			return err == nil, err
		}
	}
}

func (c *conn) reply(opt nbdproto.Opt, typ nbdproto.Rep, data []byte) error {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], nbdproto.MagicOptReply)
	binary.BigEndian.PutUint32(h[8:], uint32(opt))
	binary.BigEndian.PutUint32(h[12:], uint32(typ))
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	c.w.Write(h[:])
	c.w.Write(data)
	return c.w.Flush()
}

func (c *conn) replyErr(opt nbdproto.Opt, typ nbdproto.Rep, msg string) error {
	return c.reply(opt, typ, []byte(msg))
}

// option handles one option; done means the transmission phase starts (or,
// with ABORT, the connection ends cleanly).
func (c *conn) option(opt nbdproto.Opt, data []byte) (done bool, err error) {
	if c.s.TLSRequired && !c.tlsOn {
		switch opt {
		case nbdproto.OptStartTLS, nbdproto.OptAbort:
		case nbdproto.OptExportName:
			// EXPORT_NAME has no error reply: the spec says hang up.
			return true, fmt.Errorf("%w: EXPORT_NAME before STARTTLS on a server that requires TLS", errProtocol)
		default:
			return false, c.replyErr(opt, nbdproto.RepErrTLSReqd, "this server requires TLS: negotiate STARTTLS first (an nbds:// URI)")
		}
	}
	switch opt {
	case nbdproto.OptExportName:
		e, ok := c.s.export(string(data))
		if !ok {
			// No way to report an error to EXPORT_NAME: the spec says hang up.
			return true, errors.New(c.s.noExport(string(data)))
		}
		c.exp = e
		var b [10 + 124]byte
		binary.BigEndian.PutUint64(b[0:], e.Size)
		binary.BigEndian.PutUint16(b[8:], uint16(c.flags()))
		out := b[:]
		if c.noZeroes {
			out = b[:10]
		}
		c.w.Write(out)
		return true, c.w.Flush()
	case nbdproto.OptAbort:
		c.reply(opt, nbdproto.RepAck, nil)
		return true, io.EOF
	case nbdproto.OptList:
		if len(data) != 0 {
			return false, c.replyErr(opt, nbdproto.RepErrInvalid, "LIST takes no data")
		}
		for _, e := range c.s.Exports {
			d := binary.BigEndian.AppendUint32(nil, uint32(len(e.Name)))
			d = append(d, e.Name...)
			d = append(d, e.Description...)
			if err := c.reply(opt, nbdproto.RepServer, d); err != nil {
				return false, err
			}
		}
		return false, c.reply(opt, nbdproto.RepAck, nil)
	case nbdproto.OptStartTLS:
		switch {
		case c.s.TLS == nil:
			return false, c.replyErr(opt, nbdproto.RepErrUnsup, "TLS is not configured on this server (pd3 --tls on|require)")
		case c.tlsOn:
			return false, c.replyErr(opt, nbdproto.RepErrInvalid, "TLS is already on")
		case len(data) != 0:
			return false, c.replyErr(opt, nbdproto.RepErrInvalid, "STARTTLS takes no data")
		}
		if err := c.reply(opt, nbdproto.RepAck, nil); err != nil {
			return false, err
		}
		return false, c.startTLS()
	case nbdproto.OptStructuredReply:
		if len(data) != 0 {
			return false, c.replyErr(opt, nbdproto.RepErrInvalid, "STRUCTURED_REPLY takes no data")
		}
		c.structured = true
		return false, c.reply(opt, nbdproto.RepAck, nil)
	case nbdproto.OptInfo, nbdproto.OptGo:
		return c.infoGo(opt, data)
	case nbdproto.OptListMetaContext, nbdproto.OptSetMetaContext:
		return false, c.metaContext(opt, data)
	}
	return false, c.replyErr(opt, nbdproto.RepErrUnsup, fmt.Sprintf("option %v is not supported", opt))
}

func (c *conn) flags() nbdproto.TFlags {
	f := nbdproto.TFHasFlags | nbdproto.TFSendFlush | nbdproto.TFCanMultiConn | nbdproto.TFSendCache
	if c.exp.ReadOnly {
		f |= nbdproto.TFReadOnly
	} else {
		f |= nbdproto.TFSendFUA | nbdproto.TFSendTrim | nbdproto.TFSendWriteZeros | nbdproto.TFSendFastZero
	}
	if c.structured {
		f |= nbdproto.TFSendDF
	}
	return f
}

func (c *conn) infoGo(opt nbdproto.Opt, data []byte) (bool, error) {
	if len(data) < 6 {
		return false, c.replyErr(opt, nbdproto.RepErrInvalid, "short INFO/GO request")
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+6 > uint64(len(data)) {
		return false, c.replyErr(opt, nbdproto.RepErrInvalid, "export name overruns the request")
	}
	name := string(data[4 : 4+n])
	rest := data[4+n:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return false, c.replyErr(opt, nbdproto.RepErrInvalid, "bad information request list")
	}
	e, ok := c.s.export(name)
	if !ok {
		return false, c.replyErr(opt, nbdproto.RepErrUnknown, c.s.noExport(name))
	}
	prev := c.exp
	c.exp = e
	var b []byte
	b = binary.BigEndian.AppendUint16(b[:0], uint16(nbdproto.InfoExport))
	b = binary.BigEndian.AppendUint64(b, e.Size)
	b = binary.BigEndian.AppendUint16(b, uint16(c.flags()))
	if err := c.reply(opt, nbdproto.RepInfo, b); err != nil {
		return false, err
	}
	for i := 0; i < nreq; i++ {
		switch nbdproto.Info(binary.BigEndian.Uint16(rest[2+2*i:])) {
		case nbdproto.InfoName:
			b = binary.BigEndian.AppendUint16(b[:0], uint16(nbdproto.InfoName))
			if err := c.reply(opt, nbdproto.RepInfo, append(b, e.Name...)); err != nil {
				return false, err
			}
		case nbdproto.InfoDescription:
			b = binary.BigEndian.AppendUint16(b[:0], uint16(nbdproto.InfoDescription))
			if err := c.reply(opt, nbdproto.RepInfo, append(b, e.Description...)); err != nil {
				return false, err
			}
		}
	}
	// Block sizes are always sent: any alignment works (partial pages are
	// read-modify-written), 4 KiB is best, MaxRequest is the limit.
	b = binary.BigEndian.AppendUint16(b[:0], uint16(nbdproto.InfoBlockSize))
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, pageid.Size)
	b = binary.BigEndian.AppendUint32(b, c.s.MaxRequest)
	if err := c.reply(opt, nbdproto.RepInfo, b); err != nil {
		return false, err
	}
	if err := c.reply(opt, nbdproto.RepAck, nil); err != nil {
		return false, err
	}
	if opt == nbdproto.OptInfo {
		c.exp = prev
		return false, nil
	}
	if c.metaOK && c.metaExport != e.Name {
		c.metaOK = false // contexts were selected for another export
	}
	return true, nil
}

func (c *conn) metaContext(opt nbdproto.Opt, data []byte) error {
	if !c.structured {
		return c.replyErr(opt, nbdproto.RepErrInvalid, "negotiate structured replies first")
	}
	if len(data) < 8 {
		return c.replyErr(opt, nbdproto.RepErrInvalid, "short meta context request")
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+8 > uint64(len(data)) {
		return c.replyErr(opt, nbdproto.RepErrInvalid, "export name overruns the request")
	}
	name := string(data[4 : 4+n])
	rest := data[4+n:]
	nq := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	var queries []string
	for i := uint32(0); i < nq; i++ {
		if len(rest) < 4 {
			return c.replyErr(opt, nbdproto.RepErrInvalid, "truncated query list")
		}
		ql := binary.BigEndian.Uint32(rest)
		if uint64(ql) > uint64(len(rest)-4) {
			return c.replyErr(opt, nbdproto.RepErrInvalid, "query overruns the request")
		}
		queries = append(queries, string(rest[4:4+ql]))
		rest = rest[4+ql:]
	}
	if len(rest) != 0 {
		return c.replyErr(opt, nbdproto.RepErrInvalid, "trailing bytes after the queries")
	}
	e, ok := c.s.export(name)
	if !ok {
		return c.replyErr(opt, nbdproto.RepErrUnknown, c.s.noExport(name))
	}
	match := false
	if len(queries) == 0 {
		match = opt == nbdproto.OptListMetaContext
	}
	for _, q := range queries {
		if q == nbdproto.MetaBaseAllocation || (opt == nbdproto.OptListMetaContext && q == "base:") {
			match = true
		}
	}
	if opt == nbdproto.OptSetMetaContext {
		c.metaOK, c.metaExport = match, e.Name
	}
	if match {
		d := binary.BigEndian.AppendUint32(nil, nbdproto.MetaBaseAllocationID)
		if opt == nbdproto.OptListMetaContext {
			d = binary.BigEndian.AppendUint32(nil, 0) // ids are reserved in LIST
		}
		if err := c.reply(opt, nbdproto.RepMetaContext, append(d, nbdproto.MetaBaseAllocation...)); err != nil {
			return err
		}
	}
	return c.reply(opt, nbdproto.RepAck, nil)
}

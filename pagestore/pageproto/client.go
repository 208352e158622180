package pageproto

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/pageid"
)

// Client is a pipelined page-protocol client, safe for concurrent use.
type Client struct {
	s *pipeline.Session
}

type clientProto struct{}

func (clientProto) PutTag(hdr []byte, tag uint32) { binary.LittleEndian.PutUint32(hdr[4:], tag) }

func (clientProto) ReadHeader(r *bufio.Reader) (pipeline.Header, error) {
	b, err := r.Peek(HeaderSize)
	if err != nil {
		return pipeline.Header{}, err
	}
	var h Header
	if err := h.DecodeResponse(b); err != nil {
		return pipeline.Header{}, err
	}
	r.Discard(HeaderSize)
	return pipeline.Header{Tag: h.Tag, Status: uint16(h.Status), PayloadLen: h.ResponsePayloadLen()}, nil
}

// ClientOptions configure Dial.
type ClientOptions struct {
	// OpTimeout fails all requests of a connection that has been silent
	// this long with requests outstanding (default 30s).
	OpTimeout time.Duration
	// MaxInFlight bounds outstanding requests (default 4096).
	MaxInFlight int
}

// Dial connects to a page server at addr ("host:port" or "unix:/path").
func Dial(ctx context.Context, addr string, opt ClientOptions) (*Client, error) {
	network, a := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, a = "unix", p
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("pageproto: dialling %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if opt.MaxInFlight <= 0 {
		opt.MaxInFlight = 4096
	}
	return &Client{s: pipeline.New(nc, clientProto{}, pipeline.Options{OpTimeout: opt.OpTimeout, MaxInFlight: opt.MaxInFlight})}, nil
}

// Close closes the connection; requests in flight fail.
func (c *Client) Close() error {
	c.s.Close(fmt.Errorf("pageproto: client closed"))
	return nil
}

// Call is an asynchronous request; Wait must be called exactly once.
type Call struct {
	pc  *pipeline.Call
	err error
	op  Op
	id  pageid.Key
}

func statusCheck(pc *pipeline.Call) error { return Status(pc.Status).Err() }

// Wait returns the request's result.
func (c Call) Wait(ctx context.Context) error {
	err := c.err
	if err == nil {
		err = c.pc.WaitFn(ctx, statusCheck)
	}
	if err != nil {
		return fmt.Errorf("%v %v: %w", c.op, c.id, err)
	}
	return nil
}

func (c *Client) send(op Op, id pageid.Key, dst, payload []byte) Call {
	pc := c.s.Get()
	pc.Dst = dst
	var hb [HeaderSize]byte
	(&Header{Op: op, ID: id}).EncodeRequest(hb[:])
	if err := c.s.Send(pc, hb[:], payload); err != nil {
		return Call{err: err, op: op, id: id}
	}
	return Call{pc: pc, op: op, id: id}
}

// GetAsync starts reading page id into dst (pageid.Size bytes).
func (c *Client) GetAsync(id pageid.Key, dst []byte) Call {
	if len(dst) != pageid.Size {
		return Call{err: fmt.Errorf("pageproto: GET buffer of %d bytes", len(dst)), op: OpGet, id: id}
	}
	return c.send(OpGet, id, dst, nil)
}

// PutAsync starts writing src (pageid.Size bytes, copied before return) as page id.
func (c *Client) PutAsync(id pageid.Key, src []byte) Call {
	if len(src) != pageid.Size {
		return Call{err: fmt.Errorf("pageproto: PUT buffer of %d bytes", len(src)), op: OpPut, id: id}
	}
	return c.send(OpPut, id, nil, src)
}

// Get reads page id into dst.
func (c *Client) Get(ctx context.Context, id pageid.Key, dst []byte) error {
	return c.GetAsync(id, dst).Wait(ctx)
}

// Put writes src as page id.
func (c *Client) Put(ctx context.Context, id pageid.Key, src []byte) error {
	return c.PutAsync(id, src).Wait(ctx)
}

// Sync returns once every PUT acknowledged before it was called is at the
// memory node.
func (c *Client) Sync(ctx context.Context) error {
	return c.send(OpSync, 0, nil, nil).Wait(ctx)
}

// Volumes lists the volumes the server serves (all of them unless more).
func (c *Client) Volumes(ctx context.Context) (vs []pageid.VolumeInfo, more bool, err error) {
	page := make([]byte, pageid.Size)
	if err := c.send(OpVolumes, 0, page, nil).Wait(ctx); err != nil {
		return nil, false, err
	}
	return DecodeVolumes(page)
}

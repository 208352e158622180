package linearize

import (
	"context"

	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// PageClient runs the workload over the page protocol on volume Vol.
type PageClient struct {
	C   *pageproto.Client
	Vol uint16
	// Stride spreads the workload's pages: page pg is volume page
	// pg×Stride (0 or 1: pg), so that they fall in different extents of a
	// replicated volume.
	Stride uint64
}

func (p PageClient) key(pg uint64) pageid.Key { return pageid.MakeKey(p.Vol, pg*max(1, p.Stride)) }

func (p PageClient) Read(pg uint64, buf []byte) error {
	return p.C.Get(context.Background(), p.key(pg), buf)
}

func (p PageClient) Write(pg uint64, buf []byte) error {
	return p.C.Put(context.Background(), p.key(pg), buf)
}

func (p PageClient) Sync() error { return p.C.Sync(context.Background()) }

// NBDClient runs the workload over NBD, page pg at byte pg×4096.
type NBDClient struct{ C *nbdclient.Client }

func (n NBDClient) Read(pg uint64, buf []byte) error  { return n.C.Read(pg*4096, buf) }
func (n NBDClient) Write(pg uint64, buf []byte) error { return n.C.Write(pg*4096, buf) }
func (n NBDClient) Sync() error                       { return n.C.Flush() }

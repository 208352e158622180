package host

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/dpu/mirror/packet"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/nbd"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// Listen opens "host:port" or "unix:/path" (removing a stale socket file).
func Listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(p)
		}
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

// NBDURI is the URI clients use for export on an NBD server at addr:
// nbd://HOST:PORT/EXPORT, or nbd+unix:///EXPORT?socket=PATH for
// "unix:PATH" (the NBD URI standard, as libnbd and qemu read it).
func NBDURI(addr, export string) string {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		// Escape what would end or change the query value; keep the
		// path's slashes readable.
		esc := strings.NewReplacer("%", "%25", "&", "%26", "#", "%23", "+", "%2B", " ", "%20")
		return "nbd+unix:///" + url.PathEscape(export) + "?socket=" + esc.Replace(p)
	}
	return "nbd://" + addr + "/" + url.PathEscape(export)
}

func addrString(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return "unix:" + ln.Addr().String()
	}
	return ln.Addr().String()
}

func (h *Host) serve(ctx context.Context, cfg Config) error {
	h.lat = newLatencies()
	if h.procs = procgov.New(cfg.LoneProcs); h.procs != nil {
		h.onClose(func() error { h.procs.Other(); return nil }) // every P back
	}
	var mir, nbdMir mirror.Mirror
	switch {
	case h.Agent != nil:
		mir = h.Agent
		var ahead dpu.Ahead
		if cfg.NBDStreamFrom > 0 {
			ahead = dpu.Ahead{Read: h.Store.ReadAhead, From: int((cfg.NBDStreamFrom + pageid.Size - 1) / pageid.Size)}
		}
		nbdMir = h.Agent.HostReadsMirror(func() parse.Parser { return &parse.NBDParser{Resolve: h.resolveExport} }, ahead)
	case h.Link != nil:
		mir = h.Link
		nbdMir = h.Link.Mirror(split.ProtoNBD)
	}
	// tapped returns the mirror a frontend taps its reads into, after
	// starting a packet capture of its address instead when asked to.
	tapped := func(m mirror.Mirror, addr string) (mirror.Mirror, error) {
		switch cfg.Mirror {
		case MirrorTap:
			return m, nil
		case MirrorNone:
			return nil, nil
		}
		if h.Agent == nil { // split: the agent process captures
			return nil, nil
		}
		c, err := packet.ListenAddr(addr, m)
		if err != nil {
			return nil, err
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := c.Run(ctx); err != nil {
				cfg.Log.Warn("packet mirror stopped", "addr", addr, "err", err)
			}
		}()
		h.captures = append(h.captures, func() { c.Close(); <-done })
		return nil, nil
	}
	if cfg.NBDListen != "" {
		tlsCfg, err := NBDTLSConfig(cfg.NBDTLS, cfg.NBDTLSCertificates, cfg.RequireClientCert)
		if err != nil {
			return fmt.Errorf("host: NBD server: %w", err)
		}
		ln, err := Listen(cfg.NBDListen)
		if err != nil {
			return fmt.Errorf("host: NBD server: %w", err)
		}
		h.NBDAddr = addrString(ln)
		if nbdMir, err = tapped(nbdMir, h.NBDAddr); err != nil {
			ln.Close()
			return fmt.Errorf("host: NBD server: %w", err)
		}
		h.NBD = &nbd.Server{Backend: h.Store, Log: cfg.Log, Mirror: nbdMir, Stages: cfg.Stages, Latency: h.lat.observeNBD,
			TLS: tlsCfg, TLSRequired: cfg.NBDTLS == TLSRequire, PollFor: cfg.NBDPollFor, StreamFrom: cfg.NBDStreamFrom, Busy: h.busy, Cork: h.cork, Procs: h.procs}

		for _, v := range h.Volumes {
			h.NBD.Exports = append(h.NBD.Exports, nbd.Export{
				Name: v.Name, Volume: v.ID, Size: v.Size, ReadOnly: slices.Contains(cfg.NBDReadOnly, v.Name),
				Description: fmt.Sprintf("pd3 volume %s (%s)", v.Name, units.FormatSize(v.Size)),
			})
		}
		h.nbdDone = make(chan error, 1)
		go func() { h.nbdDone <- h.NBD.Serve(ctx, ln) }()
	}
	if cfg.PageListen == "" {
		return nil
	}
	ln, err := Listen(cfg.PageListen)
	if err != nil {
		return fmt.Errorf("host: page server: %w", err)
	}
	h.PageAddr = addrString(ln)
	if mir, err = tapped(mir, h.PageAddr); err != nil {
		ln.Close()
		return fmt.Errorf("host: page server: %w", err)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	h.Page = &pageproto.Server{Backend: h.Store, Workers: cfg.Workers, Log: cfg.Log, Mirror: mir, Latency: h.lat.observePage, Busy: h.busy, Procs: h.procs}
	go func() { h.done <- h.Page.Serve(ctx, ln) }()
	return nil
}

// resolveExport maps an NBD export name to its volume ("" = the first).
func (h *Host) resolveExport(name string) (uint16, bool) {
	if name == "" && len(h.Volumes) > 0 {
		return h.Volumes[0].ID, true
	}
	for _, v := range h.Volumes {
		if v.Name == name {
			return v.ID, true
		}
	}
	return 0, false
}

// NBDTLSConfig loads the NBD server's TLS configuration for mode from
// dir, laid out as nbdkit's --tls-certificates: server-cert.pem,
// server-key.pem and, to verify client certificates, ca-cert.pem. nil for
// TLSOff.
func NBDTLSConfig(mode TLSMode, dir string, requireClientCert bool) (*tls.Config, error) {
	if mode == TLSOff {
		return nil, nil
	}
	if dir == "" {
		return nil, fmt.Errorf("TLS %s needs a certificate directory (server-cert.pem, server-key.pem, ca-cert.pem)", mode)
	}
	f := tlsfiles.Files{Cert: filepath.Join(dir, tlsfiles.ServerCert), Key: filepath.Join(dir, tlsfiles.ServerKey)}
	ca := filepath.Join(dir, tlsfiles.CACert)
	switch _, err := os.Stat(ca); {
	case err == nil:
		f.CA = ca
	case requireClientCert:
		return nil, fmt.Errorf("verifying client certificates needs %s: %w", ca, err)
	}
	cfg, err := f.Server()
	if err != nil {
		return nil, fmt.Errorf("TLS certificates in %s: %w", dir, err)
	}
	if f.CA != "" && !requireClientCert {
		// nbdkit's default: a client certificate is checked if given.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

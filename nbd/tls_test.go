package nbd

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func loadServerTLS(t *testing.T, dir string, clientAuth tls.ClientAuthType) *tls.Config {
	t.Helper()
	cfg, err := tlsfiles.ServerFiles(dir).Server()
	require.NoError(t, err)
	cfg.ClientAuth = clientAuth
	return cfg
}

// NBD over TLS with real clients: libnbd (nbdinfo, nbdsh) and qemu. With
// TLS required, a plaintext client is refused before any export name or
// data crosses, and a client that trusts another CA fails the handshake.
func TestTLSWithRealClients(t *testing.T) {
	need(t, "nbdinfo", "nbdsh")
	t.Setenv("PATH", "/usr/bin:"+os.Getenv("PATH"))
	serverDir, clientDir := testutil.TestCA(t)
	_, otherClientDir := testutil.TestCA(t)
	r := newRig(t, 1<<20, 64*4096, func(s *Server) {
		s.TLS = loadServerTLS(t, serverDir, tls.RequireAndVerifyClientCert)
		s.TLSRequired = true
	})
	tlsURI := "nbds://" + r.addr + "/disk0?tls-certificates=" + clientDir

	assert.Equal(t, "1048576", strings.TrimSpace(run(t, "nbdinfo", "--size", tlsURI)))
	// Data both ways over TLS.
	run(t, "nbdsh", "-c", `
h.set_uri_allow_local_file(True)  # the URI names the certificates directory
h.connect_uri("`+tlsURI+`")
assert h.get_tls_negotiated()
h.pwrite(b"over tls" * 512, 8192)
assert h.pread(4096, 8192) == b"over tls" * 512
`)

	out, err := exec.Command("nbdinfo", "--size", "nbd://"+r.addr+"/disk0").CombinedOutput()
	require.Error(t, err, "a plaintext client is refused: %s", out)
	assert.Contains(t, strings.ToLower(string(out)), "tls", "%s", out)

	out, err = exec.Command("nbdinfo", "--size", "nbds://"+r.addr+"/disk0?tls-certificates="+otherClientDir).CombinedOutput()
	require.Error(t, err, "a client trusting another CA fails: %s", out)

	if _, err := exec.LookPath("qemu-img"); err == nil {
		_, port, _ := net.SplitHostPort(r.addr)
		q, err := exec.Command("qemu-img", "info", "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+clientDir,
			"--image-opts", "driver=nbd,host=127.0.0.1,port="+port+",export=disk0,tls-creds=tls0").CombinedOutput()
		require.NoError(t, err, "%s", q)
		assert.Contains(t, string(q), "virtual size: 1 MiB")
	}
}

// The option rules under TLS, with the test's own client: options other
// than STARTTLS and ABORT are refused in clear; STARTTLS twice is invalid;
// STARTTLS on a server without TLS is unsupported.
func TestTLSOptionRules(t *testing.T) {
	serverDir, _ := testutil.TestCA(t)
	r := newRig(t, 1<<20, 64*4096, func(s *Server) {
		s.TLS = loadServerTLS(t, serverDir, tls.NoClientCert)
		s.TLSRequired = true
	})

	c := dialRaw(t, r.addr)
	c.option(t, 7 /* GO */, []byte{0, 0, 0, 0, 0, 0})
	typ, msg := c.optReply(t)
	assert.Equal(t, "ERR_TLS_REQD", typ.String())
	assert.Contains(t, string(msg), "requires TLS")

	c.option(t, 5 /* STARTTLS */, nil)
	typ, _ = c.optReply(t)
	require.Equal(t, "ACK", typ.String())
	tc := tls.Client(c.nc, &tls.Config{InsecureSkipVerify: true})
	require.NoError(t, tc.HandshakeContext(context.Background()))
	c.setConn(tc)
	c.option(t, 5, nil)
	typ, _ = c.optReply(t)
	assert.Equal(t, "ERR_INVALID", typ.String(), "STARTTLS twice")
	c.option(t, 3 /* LIST */, nil)
	typ, _ = c.optReply(t)
	assert.Equal(t, "SERVER", typ.String(), "options work over TLS")

	plain := newRig(t, 1<<20, 64*4096)
	p := dialRaw(t, plain.addr)
	p.option(t, 5, nil)
	typ, msg = p.optReply(t)
	assert.Equal(t, "ERR_UNSUP", typ.String())
	assert.Contains(t, string(msg), "not configured")
}

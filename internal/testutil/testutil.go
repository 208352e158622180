// Package testutil holds helpers shared by pd3's tests.
package testutil

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Seed returns a random seed, logged so a failure can be replayed with
// PD3_SEED=n.
func Seed(t testing.TB) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("PD3_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PD3_SEED=%q: %v", v, err)
		}
		s = n
	}
	t.Logf("seed %d (PD3_SEED=%d to replay)", s, s)
	return s
}

// DropCaches empties the kernel page cache (root only). Call
// LockPageCache first.
func DropCaches(t testing.TB) {
	t.Helper()
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
		t.Fatalf("dropping caches: %v", err)
	}
}

// LockPageCache takes, until the test ends, a lock shared by every test
// that drops or inspects the kernel page cache, across test binaries:
// `go test ./...` runs packages in parallel, and a test that compares the
// page cache with what it expects must not see another drop it midway.
// Call it once per test.
func LockPageCache(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "pd3-test-pagecache.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("page-cache lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("page-cache lock: %v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}

// SyncBuffer is a bytes.Buffer that one goroutine (a logger, a child
// process's output) may write while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCA makes a CA and writes, in nbdkit's and libnbd's layouts, a
// server directory (ca-cert.pem, server-cert.pem, server-key.pem; the
// server certificate names 127.0.0.1 and localhost) and a client one
// (ca-cert.pem, client-cert.pem, client-key.pem).
func TestCA(t testing.TB) (serverDir, clientDir string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	write := func(path, typ string, der []byte) {
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	}
	writeKey := func(path string, k *ecdsa.PrivateKey) {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		require.NoError(t, err)
		write(path, "PRIVATE KEY", der)
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pd3 test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		require.NoError(t, err)
		return der, k
	}
	serverDir, clientDir = t.TempDir(), t.TempDir()
	srvDER, srvKey := leaf(2, "localhost", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	cliDER, cliKey := leaf(3, "pd3-client", x509.ExtKeyUsageClientAuth, nil, nil)
	for _, d := range []string{serverDir, clientDir} {
		write(filepath.Join(d, "ca-cert.pem"), "CERTIFICATE", caDER)
	}
	write(filepath.Join(serverDir, "server-cert.pem"), "CERTIFICATE", srvDER)
	writeKey(filepath.Join(serverDir, "server-key.pem"), srvKey)
	write(filepath.Join(clientDir, "client-cert.pem"), "CERTIFICATE", cliDER)
	writeKey(filepath.Join(clientDir, "client-key.pem"), cliKey)
	return serverDir, clientDir
}

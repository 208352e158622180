package tlsfiles

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Layout of the directories WriteCA fills: nbdkit's and libnbd's names, so
// that the same directories serve NBD (--tls-certificates) and name the
// memory-node link's files.
const (
	CACert     = "ca-cert.pem"
	ServerCert = "server-cert.pem"
	ServerKey  = "server-key.pem"
	ClientCert = "client-cert.pem"
	ClientKey  = "client-key.pem"
)

// WriteCA makes a throwaway CA, valid for a day, and writes into serverDir
// its certificate and a server certificate and key naming 127.0.0.1 and
// localhost, and into clientDir its certificate and a client certificate
// and key. For tests and benchmarks (pd3 certs makes lasting ones).
func WriteCA(serverDir, clientDir string) error {
	return CA{Hosts: []string{"127.0.0.1", "localhost"}, Valid: 24 * time.Hour}.Write(serverDir, clientDir)
}

// CA is a certificate authority of its own for one deployment: the
// server certificate it signs names Hosts (addresses or DNS names), and
// every certificate is valid for Valid from now.
type CA struct {
	Hosts []string
	Valid time.Duration
}

// Write makes the CA and writes into serverDir its certificate and a
// server certificate and key, and into clientDir its certificate and a
// client certificate and key, in nbdkit's layout (keys readable by their
// owner only). A file already there is not overwritten: Write fails
// before it writes anything.
func (c CA) Write(serverDir, clientDir string) error {
	for _, p := range []string{filepath.Join(serverDir, CACert), filepath.Join(serverDir, ServerCert), filepath.Join(serverDir, ServerKey),
		filepath.Join(clientDir, CACert), filepath.Join(clientDir, ClientCert), filepath.Join(clientDir, ClientKey)} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s exists: remove it, or choose another directory (nothing was written)", p)
		}
	}
	var ips []net.IP
	var dns []string
	for _, h := range c.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	if len(ips)+len(dns) == 0 {
		return fmt.Errorf("the server certificate names no host: give the addresses or names clients connect to")
	}
	cn := c.Hosts[0]
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial := func() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) }
	sn, err := serial()
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: "pd3 CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(c.Valid), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	leaf := func(dir, certFile, keyFile string, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		sn, err := serial()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(c.Valid), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return err
		}
		if err := write(filepath.Join(dir, certFile), "CERTIFICATE", der); err != nil {
			return err
		}
		return write(filepath.Join(dir, keyFile), "PRIVATE KEY", kder)
	}
	for _, d := range []string{serverDir, clientDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := write(filepath.Join(d, CACert), "CERTIFICATE", caDER); err != nil {
			return err
		}
	}
	if err := leaf(serverDir, ServerCert, ServerKey, cn, x509.ExtKeyUsageServerAuth, ips, dns); err != nil {
		return err
	}
	return leaf(clientDir, ClientCert, ClientKey, "pd3-client", x509.ExtKeyUsageClientAuth, nil, nil)
}

func write(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// ServerFiles names the serving end's files in a directory WriteCA filled
// (with CA: clients must present certificates).
func ServerFiles(dir string) Files {
	return Files{CA: filepath.Join(dir, CACert), Cert: filepath.Join(dir, ServerCert), Key: filepath.Join(dir, ServerKey)}
}

// ClientFiles names the connecting end's files in a directory WriteCA
// filled.
func ClientFiles(dir string) Files {
	return Files{CA: filepath.Join(dir, CACert), Cert: filepath.Join(dir, ClientCert), Key: filepath.Join(dir, ClientKey)}
}

package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of one end of a mutual-TLS link: the CA that
// signs the other end's certificates, and this end's certificate and key.
type Files struct {
	CA, Cert, Key string
}

// Enabled reports whether any file is named, i.e. TLS is wanted.
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Server loads the serving end: Cert and Key are required; with CA, every
// client must present a certificate that CA signed (mutual TLS).
func (f Files) Server() (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("TLS: serving needs a certificate and its key")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", f.Cert, f.Key, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		if cfg.ClientCAs, err = pool(f.CA); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client loads the connecting end: CA is required (the server is always
// verified); Cert and Key, both or neither, are the client's identity.
func (f Files) Client() (*tls.Config, error) {
	if f.CA == "" {
		return nil, errors.New("TLS: connecting needs the CA that signed the server's certificate")
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("TLS: a client certificate needs its key, and a key its certificate")
	}
	roots, err := pool(f.CA)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("TLS certificate %s with key %s: %w", f.Cert, f.Key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func pool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s holds no PEM certificate", path)
	}
	return p, nil
}

package tlsfiles

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFilesSayWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, WriteCA(dir, dir))
	srv, cli := ServerFiles(dir), ClientFiles(dir)
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))

	cfg, err := srv.Server()
	require.NoError(t, err)
	assert.NotNil(t, cfg.ClientCAs, "a CA makes the server verify clients")
	cfg, err = Files{Cert: srv.Cert, Key: srv.Key}.Server()
	require.NoError(t, err)
	assert.Nil(t, cfg.ClientCAs, "no CA: server-only TLS")
	cfg, err = cli.Client()
	require.NoError(t, err)
	assert.Len(t, cfg.Certificates, 1)

	for _, tc := range []struct {
		name string
		f    Files
		srv  bool
		want string
	}{
		{"server without key", Files{Cert: srv.Cert}, true, "needs a certificate and its key"},
		{"server with a missing file", Files{Cert: srv.Cert, Key: filepath.Join(dir, "nope.pem")}, true, "nope.pem"},
		{"server CA not PEM", Files{CA: notPEM, Cert: srv.Cert, Key: srv.Key}, true, "not.pem holds no PEM certificate"},
		{"client without CA", Files{Cert: cli.Cert, Key: cli.Key}, false, "needs the CA"},
		{"client cert without key", Files{CA: cli.CA, Cert: cli.Cert}, false, "needs its key"},
		{"client key of another cert", Files{CA: cli.CA, Cert: cli.Cert, Key: srv.Key}, false, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.srv {
				_, err = tc.f.Server()
			} else {
				_, err = tc.f.Client()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An etcd that serves clients over TLS and wants their certificates
// (Debian's 3.4 with --client-cert-auth): pd3 gets in with the client
// files, and without them is told etcd cannot be reached.
func TestEtcdOverMutualTLS(t *testing.T) {
	srv, cl := t.TempDir(), t.TempDir()
	require.NoError(t, tlsfiles.WriteCA(srv, cl))
	sf := tlsfiles.ServerFiles(srv)
	endpoint := externalWith(t, "https", "--cert-file", sf.Cert, "--key-file", sf.Key,
		"--trusted-ca-file", sf.CA, "--client-cert-auth")
	tlsCfg, err := tlsfiles.ClientFiles(cl).Client()
	require.NoError(t, err)
	var cli *clientv3.Client
	require.Eventually(t, func() bool {
		cli, err = Dial(context.Background(), Access{Endpoints: []string{endpoint}, TLS: tlsCfg})
		return err == nil
	}, 20*time.Second, 100*time.Millisecond)
	defer cli.Close()
	r, err := Register(context.Background(), cli, NodeRecord{ID: "n1", Addr: "10.0.0.1:7100"}, RegisterOptions{Cluster: "t"})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	noCert, err := tlsfiles.Files{CA: tlsfiles.ClientFiles(cl).CA}.Client()
	require.NoError(t, err)
	_, err = Dial(context.Background(), Access{Endpoints: []string{endpoint}, TLS: noCert})
	assert.ErrorIs(t, err, ErrUnreachable, "no client certificate")
	_, err = Dial(context.Background(), Access{Endpoints: []string{endpoint}})
	assert.ErrorIs(t, err, ErrUnreachable, "no TLS at all")
}

// An etcd with authentication enabled and a user whose role reaches only
// /pd3/: nodes register and hosts hold volumes as that user; a wrong
// password, no user at all, or a user without the role are ErrDenied.
func TestEtcdUserAndPassword(t *testing.T) {
	for name, start := range map[string]func(*testing.T) string{"embedded": embedded, "etcd 3.4": external} {
		t.Run(name, func(t *testing.T) {
			endpoint := start(t)
			ctx := context.Background()
			root := dialEventually(t, endpoint)
			for _, step := range []func() error{
				func() error { _, err := root.RoleAdd(ctx, "pd3"); return err },
				func() error {
					_, err := root.RoleGrantPermission(ctx, "pd3", "/pd3/", clientv3.GetPrefixRangeEnd("/pd3/"), clientv3.PermissionType(clientv3.PermReadWrite))
					return err
				},
				func() error { _, err := root.UserAdd(ctx, "pd3", "s3cret"); return err },
				func() error { _, err := root.UserGrantRole(ctx, "pd3", "pd3"); return err },
				func() error { _, err := root.UserAdd(ctx, "other", "pw"); return err },
				func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
				func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
				func() error { _, err := root.AuthEnable(ctx); return err },
			} {
				require.NoError(t, step())
			}
			at := []string{endpoint}
			cli, err := Dial(ctx, Access{Endpoints: at, Username: "pd3", Password: "s3cret"})
			require.NoError(t, err)
			defer cli.Close()
			r, err := Register(ctx, cli, NodeRecord{ID: "n1", Addr: "10.0.0.1:7100"}, RegisterOptions{Cluster: "t", TTL: time.Second})
			require.NoError(t, err)
			defer r.Close()
			h, err := NewHost(ctx, cli, "t", time.Second)
			require.NoError(t, err)
			defer h.Close()
			hold, err := h.Hold(ctx, "disk0", time.Second)
			require.NoError(t, err)
			require.NoError(t, hold.Release(ctx))

			for what, a := range map[string]Access{
				"wrong password":    {Endpoints: at, Username: "pd3", Password: "nope"},
				"no user":           {Endpoints: at},
				"a user without it": {Endpoints: at, Username: "other", Password: "pw"},
			} {
				_, err := Dial(ctx, a)
				assert.ErrorIs(t, err, ErrDenied, what)
			}
		})
	}
}

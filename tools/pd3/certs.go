package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pd3-go/pd3/internal/tlsfiles"
)

func certsCmd() *cobra.Command {
	var serverDir, clientDir string
	var hosts []string
	var valid time.Duration
	cmd := &cobra.Command{
		Use:   "certs --server-dir DIR --client-dir DIR",
		Short: "Make a CA of this deployment's own and its server and client certificates (for --tls and the memory-node link)",
		Long: `Make a certificate authority of this deployment's own, and sign with it a
server certificate naming --host and a client certificate. The server
directory gets ca-cert.pem, server-cert.pem and server-key.pem; the client
directory ca-cert.pem, client-cert.pem and client-key.pem: nbdkit's layout,
which libnbd and qemu read too. Keys are readable by their owner only. A
file already there is never overwritten.

Use them for NBD over TLS:
  pd3 serve --tls require --tls-certificates SERVER-DIR ...
  nbdinfo 'nbds://HOST/disk0?tls-certificates=CLIENT-DIR'
and for the memory-node link:
  pd3 memnode --tls-cert SERVER-DIR/server-cert.pem --tls-key SERVER-DIR/server-key.pem --tls-ca SERVER-DIR/ca-cert.pem
  pd3 serve --memnode-tls-ca CLIENT-DIR/ca-cert.pem --memnode-tls-cert CLIENT-DIR/client-cert.pem --memnode-tls-key CLIENT-DIR/client-key.pem ...
The CA's key is not kept: to sign more certificates, make a new set and
give every end its ca-cert.pem.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if valid <= 0 {
				return usageError{fmt.Errorf("--valid %v: want a positive duration, e.g. 8760h", valid)}
			}
			if err := (tlsfiles.CA{Hosts: hosts, Valid: valid}).Write(serverDir, clientDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "server certificate for %v in %s, client certificate in %s, valid until %s\n",
				hosts, serverDir, clientDir, time.Now().Add(valid).Format(time.DateOnly))
			return nil
		},
	}
	cmd.Flags().StringVar(&serverDir, "server-dir", "", "directory for the serving end's files (made if missing)")
	cmd.Flags().StringVar(&clientDir, "client-dir", "", "directory for the connecting end's files (made if missing)")
	cmd.Flags().StringSliceVar(&hosts, "host", []string{"127.0.0.1", "localhost"}, "addresses and names the server certificate is valid for (clients check the one they connect to)")
	cmd.Flags().DurationVar(&valid, "valid", 365*24*time.Hour, "how long the certificates are valid")
	cmd.MarkFlagRequired("server-dir")
	cmd.MarkFlagRequired("client-dir")
	return cmd
}

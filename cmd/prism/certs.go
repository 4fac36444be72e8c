package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/flagval"
)

func init() { subcommands = append(subcommands, newCertsCmd) }

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Certificates for mutual TLS between the tiers and for clients",
	}
	var (
		hosts         []string
		validity      time.Duration
		instances     int
		caCert, caKey string
	)
	initCmd := &cobra.Command{
		Use:   "init DIR [--host H ...] [--instances N] [--tls-ca FILE --tls-ca-key FILE]",
		Short: "Make a development CA and a certificate per role (router, embedding, dense, admin)",
		Long: `certs init makes a development CA and writes, for each role, a folder
DIR/ROLE (router, embedding, dense, admin; readable by the owner only)
holding the role's certificate, its key and the CA's certificate:
cert.pem, key.pem (readable by the owner only) and ca.pem, ECDSA P-256.
Hand each host only its role's folder (--certs DIR/ROLE) and keep
DIR/admin with the operators. Each certificate carries its role (URI SAN
spiffe://prism/role/ROLE); the tiers' are valid for 127.0.0.1, ::1,
localhost and every --host, the admin's is a client's only (no server,
no host). The CA's key is not kept; a folder that has a CA already
is refused.

Workers of one role sharing DIR/ROLE share one identity: the router binds
a worker id to the certificate that first announced it, so any holder of
that certificate could take over another worker's id. --instances N also
writes, for each worker role (embedding, dense), N folders
DIR/ROLE-0 ... DIR/ROLE-(N-1) of the same form, each certificate that
worker's alone (its common name ROLE-I and the URI SAN
urn:prism:instance:ROLE-I besides the role's): give worker I of a
role --certs DIR/ROLE-I. prism up does when they exist.

--tls-ca and --tls-ca-key sign the certificates with your own CA (an
organisation's root or an intermediate of it; PEM, the key unencrypted:
PKCS #8, SEC 1 EC or PKCS #1 RSA) instead of a development CA: ca.pem
is then that CA's certificate, its key is read and never copied, and the
certificates expire with it at the latest.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// InitCerts takes 0 for its default, two years.
			if err := flagval.Positive(cmd.Flags(), "validity"); err != nil {
				return err
			}
			// --validity 1ns (or 1s meant as a year) wrote a set expired
			// by the time a tier read it.
			if validity < time.Hour {
				return fmt.Errorf("--validity %s: want at least 1h (Go durations: 8760h is a year)", validity)
			}
			err := auth.InitCerts(args[0], auth.CertOptions{Hosts: hosts, Validity: validity, Instances: instances, CACert: caCert, CAKey: caKey})
			if errors.Is(err, auth.ErrCAExists) {
				return fmt.Errorf("%w: use it as it is, or give certs init a new folder", err)
			}
			if err != nil {
				return fmt.Errorf("certs init: %w", err)
			}
			what := "a CA"
			if caCert != "" {
				what = "certificates signed by " + caCert
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and a folder per role into %s: %v (give each process only its role's folder)\n", what, args[0], auth.Roles)
			if instances > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "and a folder per worker instance: %s ... %s, %s ... %s (give worker I of a role only ROLE-I)\n",
					auth.InstanceName(auth.Embedding, 0), auth.InstanceName(auth.Embedding, instances-1), auth.InstanceName(auth.Dense, 0), auth.InstanceName(auth.Dense, instances-1))
			}
			return nil
		},
	}
	initCmd.Flags().StringArrayVar(&hosts, "host", nil, "a host name or IP address the certificates are also valid for; repeatable")
	initCmd.Flags().IntVar(&instances, "instances", 0, "also make N certificates of their own per worker role (DIR/embedding-0 ..., DIR/dense-0 ...), one per worker")
	initCmd.Flags().DurationVar(&validity, "validity", 2*365*24*time.Hour, "how long the CA and certificates are valid")
	initCmd.Flags().StringVar(&caCert, "tls-ca", "", "sign with this CA's certificate (PEM; yours, instead of a development CA), with --tls-ca-key")
	initCmd.Flags().StringVar(&caKey, "tls-ca-key", "", "the --tls-ca CA's key (PEM, unencrypted); read, never copied")
	cmd.AddCommand(initCmd)
	return cmd
}

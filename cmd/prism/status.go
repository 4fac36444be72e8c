package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

func init() { subcommands = append(subcommands, newStatusCmd) }

// newStatusCmd is `prism status`: the workers a router knows and what
// it does with each, from its registry (Registry.List). The table is
// router.WriteFleet's; this file only dials and parses flags.
func newStatusCmd() *cobra.Command {
	var (
		tlsFlags authflag.Flags
		addr     string
		asJSON   bool
		check    bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [--router ADDR] [--certs DIR] [--json | --check]",
		Short: "Show the workers a router knows, per model: serving, behind on updates, diverged, and their addresses",
		Long: `Status asks a router (prism up's, or serve router's) for its registry
and prints a row per worker and model: its role, address, state
(serving; behind: lacks acknowledged embedding updates and is being
caught up; diverged: its copy of the tables differs from its peers',
out of serving for good until its store is replaced; stranded: behind
by updates the router's log no longer holds, out until its store is
replaced too; left out: it claims updates the router never numbered;
settling: the router's
start-up window; unhealthy), the updates it holds against the last
acknowledged, and its requests in flight. Then a line for each model
(or shard) that no worker serves in a role: its requests fail. A router
that follows another for updates does not know which embedding workers
are in sync: it names the one that does, to ask instead. For each
worker out for good it names a worker to copy its store from
(prism store copy). The caller needs an admin
certificate (--certs DIR, as made by prism certs init or prism up), or
any role's folder: inside a tier's Pod, --certs with the folder the
chart mounts.
--json prints the registry's answer as JSON instead; --check exits
non-zero when a model or shard has no worker serving it in a role, or a
worker is out for good (diverged, left out, stranded), for scripts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagval.Positive(cmd.Flags(), "timeout"); err != nil {
				return err
			}
			tlsFlags.WarnClient(cmd.ErrOrStderr(), "prism status")
			creds, err := tlsFlags.Dial(auth.Admin, auth.Router)
			if err != nil {
				return err
			}
			conn, err := grpc.NewClient(addr, creds, serve.ListDialOption())
			if err != nil {
				return fmt.Errorf("dial router %s: %w", addr, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			resp, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
			if err != nil {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return fmt.Errorf("router %s: no answer within --timeout %v: %w", addr, timeout, err)
				}
				return fmt.Errorf("router %s: %w", addr, err)
			}
			if asJSON && check {
				return errors.New("--check goes with the table, not --json")
			}
			if asJSON {
				b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(resp)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return err
			}
			if err := router.WriteFleet(cmd.OutOrStdout(), resp); err != nil {
				return err
			}
			if problems := router.FleetProblems(resp); check && len(problems) > 0 {
				return fmt.Errorf("--check: %d problem(s): %s", len(problems), strings.Join(problems, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "router", "127.0.0.1:8500", "the router's gRPC address")
	f.BoolVar(&asJSON, "json", false, "print the registry's answer (prism.v1.ListResponse) as JSON")
	f.BoolVar(&check, "check", false, "exit non-zero when a model (or shard) has no worker serving it in a role, or a worker is out for good (diverged, left out, stranded); behind and settling workers pass")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the router's answer")
	tlsFlags.Register(cmd, auth.Admin)
	return cmd
}

// Command prism is Prism's single binary: one subcommand per job.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// subcommands is filled by the init functions of this package's files, one
// file per job, so adding a job never touches this file.
var subcommands []func() *cobra.Command

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "prism",
		Short:         "Prism serves deep learning recommendation models split across CPU and GPU tiers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, mk := range subcommands {
		root.AddCommand(mk())
	}
	return root
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prism:", err)
		os.Exit(1)
	}
}

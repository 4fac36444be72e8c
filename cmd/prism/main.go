// Command prism is Prism's single binary: one subcommand per job.
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	root.SetFlagErrorFunc(flagError) // the subcommands inherit it
	for _, mk := range subcommands {
		root.AddCommand(mk())
	}
	return root
}

// numberWanted is what a numeric flag of each pflag type takes.
var numberWanted = map[string]string{
	"int": "a whole number", "int32": "a whole number", "int64": "a whole number",
	"uint": "a whole number, 0 or more", "uint32": "a whole number, 0 or more", "uint64": "a whole number, 0 or more",
	"float32": "a number", "float64": "a number", "bool": "true or false",
}

// flagError says what a numeric flag wants where pflag would pass on
// strconv's message (`invalid argument "abc" for "--seed" flag:
// strconv.ParseUint: parsing "abc": invalid syntax`); other flag errors
// are returned as they are.
func flagError(cmd *cobra.Command, err error) error {
	if hint := unknownFlagHint(cmd, err); hint != "" {
		return fmt.Errorf("%w (%s)", err, hint)
	}
	var iv *pflag.InvalidValueError
	var ne *strconv.NumError
	if !errors.As(err, &iv) || !errors.As(err, &ne) || iv.GetFlag() == nil {
		return err
	}
	want, ok := numberWanted[iv.GetFlag().Value.Type()]
	if !ok {
		return err
	}
	name := "--" + iv.GetFlag().Name
	if errors.Is(ne.Err, strconv.ErrRange) {
		return fmt.Errorf("%s %q: out of range for a flag of type %s", name, iv.GetValue(), iv.GetFlag().Value.Type())
	}
	return fmt.Errorf("%s %q: want %s", name, iv.GetValue(), want)
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "prism:", err)
		os.Exit(1)
	}
}

// unknownFlagHint points a flag a command does not take to the one it
// does, where a sibling command takes it: prism up runs every role, so
// it takes a certificate folder and not one certificate's files.
func unknownFlagHint(cmd *cobra.Command, err error) string {
	if cmd == nil || cmd.Name() != "up" {
		return ""
	}
	for _, f := range []string{"--tls-cert", "--tls-key"} {
		if strings.Contains(err.Error(), "unknown flag: "+f) {
			return "prism up runs every role and takes a folder of their certificates: --certs DIR, made by prism certs init DIR; --tls-ca and --tls-ca-key sign it with your CA"
		}
	}
	return ""
}

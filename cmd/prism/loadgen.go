package main

import "github.com/prism-serve/prism/loadgen/cli"

func init() { subcommands = append(subcommands, cli.New) }

// Command gpulink is gpulink's command line: topology and simulate work
// offline, inspect reads a cluster.
// Installed as kubectl-gpulink it also serves as a kubectl plugin.
package main

import (
	"os"

	"github.com/gpulink/gpulink/internal/cli"
)

func main() {
	os.Exit(cli.Execute(os.Args, os.Stdout, os.Stderr))
}

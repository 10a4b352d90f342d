// Package cli implements the gpulink command line: offline tools that show
// what gpulink makes of a node's GPU topology and how its allocator would
// place a series of requests, and `inspect`, which shows a cluster's GPUs,
// their holders and link matrices. The same binary serves as the kubectl
// plugin kubectl-gpulink.
package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// subcommands builds every subcommand of the root. A new command lives in
// its own file and adds its constructor here; prog is the program's display
// name (see DisplayName), for examples in help text.
var subcommands = []func(prog string) *cobra.Command{
	newTopologyCommand,
	newSimulateCommand,
	newInspectCommand,
	newExplainCommand,
}

// kubectlPluginPrefix is how kubectl finds plugins on the PATH.
const kubectlPluginPrefix = "kubectl-"

// DisplayName is the command name to show in help and errors for a binary
// started as argv0: "kubectl gpulink" when kubectl runs it as the plugin
// kubectl-gpulink, otherwise the binary's own name.
func DisplayName(argv0 string) string {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	if plugin, ok := strings.CutPrefix(base, kubectlPluginPrefix); ok && plugin != "" {
		// kubectl maps dashes in the plugin file name to spaces and
		// underscores back to dashes: kubectl-foo_bar is "kubectl foo-bar".
		return "kubectl " + strings.ReplaceAll(plugin, "_", "-")
	}
	if base == "" || base == "." || base == string(filepath.Separator) {
		return "gpulink"
	}
	return base
}

// NewRootCommand returns the root command with every subcommand attached.
// displayName is what help text calls the program (see DisplayName).
func NewRootCommand(displayName string) *cobra.Command {
	root := &cobra.Command{
		Use:   "gpulink",
		Short: "Topology-aware GPU allocation tools for Kubernetes DRA",
		Long: `gpulink is a Kubernetes DRA driver for NVIDIA GPUs that places multi-GPU
requests on the best-connected GPUs. This command inspects topologies and
simulates allocations offline (topology, simulate), shows what a
cluster's GPUs hold (inspect) and why a pod got its GPUs or waits (explain).`,
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: displayName},
		// Usage after a failed run buries the error; flag and argument
		// errors still point at --help (see Execute).
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(flagUsageError)
	for _, sub := range subcommands {
		root.AddCommand(sub(displayName))
	}
	return root
}

// Execute runs the command line argv (argv[0] being the program) and
// returns the process exit code: 0 on success, 1 on any error, which is
// printed to stderr.
func Execute(argv []string, stdout, stderr io.Writer) int {
	argv0 := "gpulink"
	if len(argv) > 0 {
		argv0, argv = argv[0], argv[1:]
	}
	root := NewRootCommand(DisplayName(argv0))
	root.SetArgs(argv)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	if cmd != nil && isUsageError(err) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return 1
}

package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpulink/gpulink/driver/topology"
)

func newTopologyCommand(prog string) *cobra.Command {
	output := outputTable
	cmd := &cobra.Command{
		Use:   "topology FILE",
		Short: "Show what gpulink makes of a node's `nvidia-smi topo -m` output",
		Long: `Parse the output of ` + "`nvidia-smi topo -m`" + ` saved in FILE and show the link
matrix, the NVLink islands, the best-aligned GPU groups of each size and the
attributes the kubelet plugin would publish for each device of such a node.`,
		Example: "  nvidia-smi topo -m > node.txt\n" +
			"  " + prog + " topology node.txt\n" +
			"  " + prog + " topology node.txt --output json | jq .islands",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := topology.ParseFile(args[0])
			if err != nil {
				return err
			}
			view, err := newTopologyView(t)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if output == outputJSON {
				return writeJSONDocument(cmd.OutOrStdout(), view)
			}
			return writeTopologyTable(cmd.OutOrStdout(), args[0], t, view)
		},
	}
	cmd.Flags().VarP(&output, "output", "o", "output format: table or json")
	return cmd
}

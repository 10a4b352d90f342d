package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

func newSimulateCommand(prog string) *cobra.Command {
	output := outputTable
	var scenario string
	var trace traceFlags
	var gangs gangFlags
	cmd := &cobra.Command{
		Use:   "simulate --scenario FILE",
		Short: "Replay allocations and frees against simulated nodes",
		Long: `Run a what-if scenario through gpulink's allocator: nodes described by their
` + "`nvidia-smi topo -m`" + ` output, then a list of steps that allocate whole GPUs or
shares and free them again. Each step reports where the allocator put the
request, the weakest link in the chosen set and what is left free, or why the
request could not be met (the run goes on).

Scenario format (YAML or JSON; unknown fields are errors):

  nodes:
  - name: node-a
    topology: dgx1.txt    # relative to the scenario file
    gpuMemory: 32Gi       # per GPU, default 80Gi
    allocated: [1, 6]     # GPU indices already in use
    maxSharesPerGPU: 16   # optional, default the allocator's
  policy: {node: binpack, gpu: binpack}   # or spread
  sizeMix:              # optional: how often each size is asked for;
  - {gpus: 1, weight: 6}  # the allocator keeps free what is asked for
  - {gpus: 2, weight: 3}  # most (default: sizes 1-8 equally often)
  - {gpus: 4, weight: 1}
  recentMix: {window: 512, refresh: 64}  # or, instead of sizeMix, the
                        # controller's recent mix over these steps' sizes
  steps:
  - {alloc: job-1, gpus: 2}                    # whole GPUs
  - {alloc: job-2, gpus: 4, require: NVLink}   # NVLink, NV1..NV18, PIX, PXB, PHB, NODE, SYS
  - {alloc: job-3, memory: 10Gi, cores: 30}    # a share; defaults 4Gi, 25
  - {alloc: job-4, gpus: 1, node: node-a}      # pinned to one node
  - {free: job-1}

With --trace DIR it replays FGD's production trace instead (USENIX ATC '23;
alibaba/clusterdata cluster-trace-gpu-v2023): tasks drawn from each list
until their GPU requests reach 130 % of the cluster's GPUs, over --seeds
repetitions, placed by gpulink's allocator and by the paper's baselines;
it prints per arrival step the GPU requests not allocated and the
fragmentation rate (docs/performance/trace.md).

With --gang-trace DIR it replays multi-node jobs (gangs: Kalos's jobs and a
draw from the spot trace's published sizes) on clusters of 8-GPU nodes in
NVLink cliques, leaves and spines, time-scaled to --gang-loads, placed all
or nothing by gpulink's gang placement and by per-pod greedy, Kueue TAS,
Volcano HyperNode tiers and random: gangs placed, on their minimal level,
GPUs held idle by partly placed gangs, queueing delay and GPU utilisation
(docs/performance/gangs.md).`,
		Example: "  " + prog + " simulate --scenario demo/scenarios/example.yaml\n" +
			"  " + prog + " simulate --scenario demo/scenarios/example.yaml -o json\n" +
			"  " + prog + " simulate --trace ../shared/traces/openb --seeds 3 --svg trace.svg\n" +
			"  " + prog + " simulate --gang-trace ../shared/traces/gangs --gang-seeds 3",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gangs.dir != "" {
				if scenario != "" || trace.dir != "" {
					return usageError{errors.New("--gang-trace excludes --scenario and --trace")}
				}
				return gangs.run(cmd.OutOrStdout())
			}
			if trace.dir != "" {
				if scenario != "" {
					return usageError{errors.New("--scenario and --trace are mutually exclusive")}
				}
				return trace.run(cmd.OutOrStdout())
			}
			if scenario == "" {
				return usageError{errors.New("--scenario is required (or --trace DIR, or --gang-trace DIR)")}
			}
			ls, err := loadScenario(scenario)
			if err != nil {
				return err
			}
			outcomes, err := simulate(ls)
			if err != nil {
				return err
			}
			if output == outputJSON {
				for _, o := range outcomes {
					if err := writeJSONLine(cmd.OutOrStdout(), o); err != nil {
						return err
					}
				}
				return nil
			}
			return writeSimulationTable(cmd.OutOrStdout(), ls, outcomes)
		},
	}
	cmd.Flags().StringVarP(&scenario, "scenario", "f", "", "scenario file (YAML or JSON)")
	cmd.Flags().VarP(&output, "output", "o", "output format: table or json")
	trace.register(cmd)
	gangs.register(cmd)
	return cmd
}

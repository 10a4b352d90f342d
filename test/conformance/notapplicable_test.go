//go:build e2e

package conformance_test

// notApplicable records the peer files that test features gpulink does not
// have, or that cannot run on an offline test node, each with what gpulink
// does instead.
func notApplicable(na func(reason string, files ...string)) {
	const nv, ex, k = "dra-driver-nvidia-gpu/", "dra-example-driver/", "kubernetes-e2e-dra/"
	const mig = "MIG: gpulink gives out the MIG devices that exist (`mig.gpulink.dev`; `nvidia.com/mig-<profile>` through its webhook), but this suite's node simulates GPUs without MIG mode; test/e2e TestMIGE2E runs such pods on a simulated A100 in MIG mode"
	na(mig, nv+"quickstart-v1/gpu-test4.yaml", nv+"extended-resources/mig-1g-12gb.yaml",
		nv+"bats/gpu-anymig.yaml", nv+"bats/gpu-simple-mig.yaml", "hami/examples-nvidia/mig_example.yaml")
	na("dynamic MIG: gpulink creates no MIG instances on demand yet; it shares a GPU by memory/cores with MPS or HAMi-core limits",
		"hami/examples-nvidia/dynamic_mig_example.yaml")
	const ts = "time-slicing: gpulink shares through `gpu-share.gpulink.dev` capacity (memory, cores) with MPS or HAMi-core limits"
	na(ts, nv+"bats/gpu-timeslicing.yaml",
		nv+"e2e-templates/timeslicing.yaml.tmpl", ex+"basic-resourceclaim-opaque-config/basic-resourceclaim-opaque-config.yaml")
	na("CUDA samples fetched from the network: not runnable offline; its claim is gpu-simple-full.yaml's",
		nv+"bats/gpu-cuda-demo-suite.yaml", nv+"bats/gpu-cuda-busgrind.yaml")
	na("vLLM pulling a model from the network: not runnable offline; its resources translate like use_memory_fraction.yaml's",
		"hami/examples-nvidia/vllm_cross_vgpu.yaml")
	na("Ginkgo template of NVIDIA's e2e framework; the cases it renders are those of the bats specs",
		nv+"e2e-templates/consumable-shares-memory.yaml.tmpl", nv+"e2e-templates/consumable-shares-unlimited.yaml.tmpl",
		nv+"e2e-templates/driver-version.yaml.tmpl", nv+"e2e-templates/error-handling.yaml.tmpl",
		nv+"e2e-templates/memory-size.yaml.tmpl", nv+"e2e-templates/product-type.yaml.tmpl")
	na("partitionable devices (KEP-4815): gpulink publishes whole GPUs with consumable `memory`/`cores` instead",
		ex+"gpu-allow-multiple-allocations-partitionable/gpu-allow-multiple-allocations-partitionable.yaml", ex+"partitionable-devices/partitionable-devices.yaml")
	na("binding conditions (KEP-5007): gpulink's devices are ready when published",
		ex+"binding-conditions/binding-conditions.yaml")
	na("KEP-5004 extended resources bypass gpulink's allocator; gpulink's webhook translates `nvidia.com/gpu` and HAMi's resources instead",
		ex+"extended-resource-request/extended-resource-request.yaml")
	na("not GPUs: CPU profile, NIC bandwidth, PodGroup gang (alpha)",
		ex+"native-resource-request/native-resource-request.yaml", ex+"net-consumable-capacity/net-consumable-capacity.yaml",
		ex+"podgroup-resourceclaimtemplate/podgroup-resourceclaimtemplate.yaml")
	na("scheduler_perf harness input for the in-tree test driver; gpulink's controller is benchmarked in test/scale",
		k+"scheduler-perf-dra/consumablecapacity-performance-config.yaml", k+"scheduler-perf-dra/extendedresource-performance-config.yaml",
		k+"scheduler-perf-dra/performance-config.yaml", k+"scheduler-perf-dra/templates/deviceclass-consumablecapacity.yaml",
		k+"scheduler-perf-dra/templates/deviceclass-extended-resource.yaml", k+"scheduler-perf-dra/templates/deviceclass.yaml",
		k+"scheduler-perf-dra/templates/node-with-dra-test-driver.yaml", k+"scheduler-perf-dra/templates/pod-with-claim-template.yaml",
		k+"scheduler-perf-dra/templates/pod-with-extended-resource.yaml", k+"scheduler-perf-dra/templates/resourceclaim.yaml",
		k+"scheduler-perf-dra/templates/resourceclaimtemplate-consumablecapacity.yaml", k+"scheduler-perf-dra/templates/resourceclaimtemplate-for-two-devices.yaml",
		k+"scheduler-perf-dra/templates/resourceclaimtemplate.yaml", k+"scheduler-perf-dra/templates/resourceslice-basic-devices.yaml",
		k+"scheduler-perf-dra/templates/resourceslice-consumablecapacity.yaml")
	na("kind configuration of the upstream suite; test/localcluster is the cluster here",
		k+"kind.yaml")
	na("the test driver's DeviceClass; the ported manifests use `gpu.gpulink.dev`",
		k+"test-driver-examples/deviceclass.yaml")
	na("the test driver's RBAC; gpulink's chart ships its own (checked by TestHelmInstallOnRealNode)",
		k+"test-driver-examples/plugin-permissions.yaml")
	na("alpha API (DRAResourcePoolStatus, off); `gpulink explain` and metrics report pool usage",
		k+"test-driver-examples/resourcepoolstatusrequest.yaml")
}

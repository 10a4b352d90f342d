// Package gpucheck is gpulink's GPU acceptance suite (cmd/gpulink-gpucheck,
// make gpu-check): checks that need a real NVIDIA GPU and driver and no
// Kubernetes, run on one host, reported as one table (Report).
//
//   - smi.go: nvidia-smi --query-gpu and topo -m output against NVML
//     discovery (ParseQueryGPU, CompareQueryGPU, CompareTopo).
//   - prepare.go: the seam to the kubelet plugin. PluginPreparer drives
//     kubeletplugin.Driver.PrepareResourceClaims, the plugin's own prepare
//     code, for allocated claims built like the controller writes them
//     (WholeClaim, ShareClaim), and hands back the CDI device IDs the kubelet
//     would get. The suite resolves exactly those IDs in the plugin's CDI
//     directory, so a change of the spec layout (a per-node base spec next to
//     the per-claim specs, from nvcdi) needs no change here as long as the
//     prepare result names every CDI device a container needs; a change of
//     the plugin's constructor or of its MPS daemon type is confined to
//     NewPluginPreparer and PluginPreparerOptions.
//   - container.go, rootfs.go: an OCI bundle per container, with the CDI
//     devices injected by the CDI library (cache.InjectDevices, as containerd
//     does) into a spec like `runc spec`'s, and a root file system made from
//     the host's files (RootfsHost, RootfsCDIOnly), run with runc.
//   - probe.go, probe/gpucheck-probe.cu: the CUDA program in the containers,
//     built on the GPU host with nvcc, reports facts as "gpucheck: key=value"
//     lines; the verdicts (CheckIsolation, CheckCUDA, CheckAlloc) are Go.
//   - containers.go: building bundles and running probe containers, one or
//     several at once (the throughput rows start them together).
//   - sharing.go, throughput.go, lifetime.go: what shares give, measured
//     with the probe's timed kernel; daemonpod.go, podkubelet.go: the MPS
//     daemon pod run as the kubelet would run it.
//   - suite.go: the order of the checks (Run), CheckHost's fast failure on a
//     host without a GPU, and the dry run, which runs the GPU-less parts
//     with go-nvml mock GPUs, /dev/null standing in for /dev/nvidia* and a
//     shell in place of the probe.
//
// Everything that runs a program goes through a Runner, so the unit tests
// play a whole GPU host (nvidia-smi, nvcc, runc) from fixtures.
package gpucheck

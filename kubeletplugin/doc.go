// Package kubeletplugin is gpulink's DRA kubelet plugin (driver
// gpu.gpulink.dev, binary gpulink-kubeletplugin): it discovers the node's
// GPUs, publishes them as ResourceSlices with the upstream
// k8s.io/dynamic-resource-allocation/kubeletplugin helper, and prepares
// allocated ResourceClaims for containers by writing CDI specs. This
// comment is the contract; docs/design/kubeletplugin.md gives the
// reasoning and the details.
//
// # What it owns
//
// Discovery (NVML, the go-nvml mocks or a topology file; NewDiscoverer),
// the node's ResourceSlices, the per-claim and base CDI specs, the
// checkpoint of prepared claims, the GPUs' health as the kubelet and the
// slices see it, and the per-pod GPU metrics. The MPS control daemons are
// package kubeletplugin/mps's; this package starts and stops them per
// claim.
//
// # Inputs and outputs
//
// Published: one pool named after the node. Each GPU not in MIG mode is a
// device gpu-<index> (driver.DeviceName) with its identity, NUMA and PCI
// attributes, its NVLink island, aligned group IDs (group2, group4, ...),
// its row of the node's link matrix ("links", decoded by
// topology.DecodeLinkRows) and consumable capacity memory (bytes) and
// cores (100 = the whole GPU), so one GPU can be allocated whole or as
// several shares. Each existing MIG device is an exclusive device
// gpu-<index>-mig-<GI>-<CI> (driver.MIGDeviceName). With
// --managed-by-controller (the default) every device carries the taint
// gpu.gpulink.dev/managed-by-controller:NoSchedule so that only the
// gpulink controller allocates it; an unhealthy GPU also carries
// gpu.gpulink.dev/unhealthy. Nothing is truncated to fit the API's
// limits: a node that cannot be published fails the plugin's start. The
// format is internal/sliceformat's (Encode here, DecodePool for readers).
//
// Prepare (Driver.PrepareResourceClaims) takes the claim's results in this
// node's pool and the driver's opaque configs (api/v1alpha1) and returns
// CDI device IDs: one device per GPU (CDIDeviceIDForDevice), the node's
// base device with the driver's files (CDIBaseDeviceID, from nvcdi), and
// one claim device (CDIDeviceID) with the control device nodes,
// NVIDIA_VISIBLE_DEVICES, the share variables and the sharing strategy's
// limits (MPS or HAMi-core). Unprepare undoes it. Both are idempotent.
//
// # Invariants
//
//   - Every claim is checked by the controller's rules whoever allocated
//     it: no share under sharing strategy None, a claim may only narrow
//     its class's sharing settings (v1alpha1.CheckClaimNarrows), whole
//     GPUs exclusive, shares of one GPU within its memory and cores, MPS
//     shares of one claim at one core percentage, MIG devices whole and
//     only by their MIG UUID. A refused claim names the claim, the field
//     and the values, and leaves nothing behind.
//   - A container gets the device nodes of its claim's GPUs only (device
//     nodes are never in the base spec).
//   - Each MPS claim of mode Isolated has its own control daemon, started
//     with the claim's limits before any of its containers exists; its
//     pipe and shm directories are mounted into that claim's containers
//     only. The Concurrent shares of one namespace on one GPU share one
//     daemon (limits in each client's environment), counted per claim in
//     the checkpoint and stopped with the group's last claim
//     (docs/mps.md, "Isolated and Concurrent MPS").
//   - The checkpoint (checkpoint.json: checksummed, written atomically,
//     dropped on a new boot) records a claim as PrepareStarted before any
//     side effect and PrepareCompleted after its CDI spec; at start,
//     interrupted prepares are rolled back and CDI specs match the
//     checkpoint. A corrupt checkpoint is moved aside, not fatal; one of
//     another format version (a rollback) stops the start untouched, and
//     one with unknown fields is read for what this version knows.
//   - Shutdown and rolling updates keep the node's slices and prepared
//     claims; two plugin instances of one node share the checkpoint under
//     a file lock and only one publishes.
//   - A fatal GPU event (XID, ECC, GPU lost) taints the device and reports
//     it Unhealthy to the kubelet; when NVML cannot be read at all the
//     health is Unknown and /healthz fails.
//
// # Where to start reading
//
// driver.go: Options, New, Run (registration); publish.go: discovery
// and publishing; slices.go: the slices, from sliceformat.Encode.
// discovery.go: the GPUs. prepare.go: prepare and unprepare; plan.go:
// what a claim means on this node; claimshape.go and conflicts.go: a
// claim's own shape and its conflicts with prepared claims; apply.go:
// the side effects and their undoing; cdi.go, cdibase.go, cdiviews.go,
// containergroup.go: the specs; claimconfig.go and priority.go: configs
// and their checks; prepare_mig.go: MIG devices; ondemand.go and
// ondemand_recovery.go: MIG on demand; mps_limits.go: the MPS limits
// loop. checkpoint.go, recovery.go, rolling.go: state across restarts.
// health.go, health_nvml.go, health_file.go: device health (policy in
// driver/health). metrics.go, podmetrics.go: the metrics.
//
// See docs/design/kubeletplugin.md for the reasoning: the ResourceSlice
// format and the links encoding, why devices are tainted, what each CDI
// device holds, the driver's base spec and the CDI hook, why MPS daemons
// are per claim and run as pods with a device plugin of their own, the
// checkpoint's recovery cases, per-pod metrics, why shutdown leaves the
// slices, rolling updates, and the health sources and recovery.
package kubeletplugin

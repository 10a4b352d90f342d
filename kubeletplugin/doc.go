// Package kubeletplugin is gpulink's DRA kubelet plugin (driver
// gpu.gpulink.dev). It discovers the node's GPUs, publishes them as
// ResourceSlices with the k8s.io/dynamic-resource-allocation/kubeletplugin
// helper, and prepares allocated ResourceClaims for containers by writing
// CDI specs.
//
// # ResourceSlices
//
// The node publishes one pool named after the node. Every GPU is one
// device, named gpu-<index> (driver.DeviceName), so the controller can map
// a device back to nvidia-smi's numbering. Attributes (unqualified names
// belong to gpu.gpulink.dev):
//
//	index, minor                  int     nvidia-smi index, /dev/nvidia<minor>
//	uuid, productName,            string  when discovery knows them
//	architecture
//	cudaComputeCapability,        version semver: "8.0" -> "8.0.0",
//	driverVersion                         "535.104.05" -> "535.104.5"
//	resource.kubernetes.io/pciBusID       when known (deviceattribute helper)
//	resource.kubernetes.io/pcieRoot       when known
//	numaNode                      int     when known (not published if -1)
//	nvlinkIsland                  int     ID of the GPU's NVLink island
//	group<k>                      int     for every k in topology.GroupSizes(n)
//	                                      for which the GPU is in an aligned
//	                                      group of k GPUs: the group's ID, so
//	                                      a claim can use matchAttribute on
//	                                      gpu.gpulink.dev/group<k>
//	links                         string  the GPU's row of the node's link
//	                                      matrix, see below
//
// # The links attribute
//
// A node's link matrix cannot be published as a matrix (list attributes
// need an alpha feature gate), so each device carries its own row, and the
// controller rebuilds the matrix from the slices alone with
// topology.DecodeLinkRows. Character j of the row of GPU i is the link
// from GPU i to the GPU with index j, for j = 0 .. the node's largest GPU
// index, so all rows of a node are equally long:
//
//	X       j == i
//	.       no GPU with index j on this node
//	S N H B P     SYS, NODE, PHB, PXB, PIX
//	1..9    NV1..NV9
//	a..i    NV10..NV18
//
// For example the row of GPU0 of an 8-GPU hybrid cube mesh is "X112SS2S".
// String attributes are at most 64 characters, so a node whose largest GPU
// index is 64 or more cannot be published: BuildDriverResources fails
// with an error naming the GPU and the plugin does not start. It never
// drops or truncates an attribute to fit a limit; every device is checked
// against the API's limits (at most 32 attributes and capacities, C
// identifiers of at most 32 characters, string and version values of at
// most 64 characters, at most 128 devices per slice, 64 when devices are
// tainted) before anything is published.
//
// # Capacity and sharing
//
// Every device declares capacity memory (bytes) and cores (100 = the whole
// GPU) and allowMultipleAllocations: true, so one GPU can be allocated
// several times as shares (DRAConsumableCapacity). The request policies
// are memory: default --default-share-memory (clamped to the GPU), range
// 1Mi..GPU memory in 1Mi steps; cores: default --default-share-cores,
// range 1..100 in steps of 1. A result with a shareID is a share, sized by
// its consumedCapacity (falling back to the config's defaultMemory and
// defaultCores, then to the flags); a result without one is the whole GPU.
//
// # Why devices are tainted
//
// With --managed-by-controller (the default) every device carries the
// taint gpu.gpulink.dev/managed-by-controller=true:NoSchedule. The gpulink
// controller allocates claims itself (it knows the link matrix and packs
// shares); kube-scheduler must not allocate the same devices behind its
// back, because nothing in the API stops two allocators from choosing one
// device at the same time. A NoSchedule device taint keeps kube-scheduler
// from allocating a device to any request that does not tolerate it, while
// claims that are already allocated (by the controller) are not affected,
// so pods using them schedule normally. Tainted devices lower the API's
// limit to 64 devices per slice, which BuildDriverResources respects.
//
// # Prepare and CDI
//
// PrepareResourceClaims takes the results of driver gpu.gpulink.dev in the
// node's pool and the driver's opaque configs (class entries first, then
// the claim's, later entries overriding; an entry applies to all requests
// or to the listed ones), resolved with api/v1alpha1. It writes one
// transient CDI spec per claim (kind gpu.gpulink.dev/claim, file
// gpu.gpulink.dev-claim_<uid>.json in --cdi-root) with one CDI device named
// after the claim UID, and returns that device for every result of the
// claim. The device holds /dev/nvidia<minor> of each of the claim's GPUs,
// /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools (host side
// under --driver-root), NVIDIA_VISIBLE_DEVICES with exactly the claim's
// GPUs (UUIDs, indexes when unknown), CUDA_DEVICE_ORDER=PCI_BUS_ID and, per
// shared GPU at the ordinal the container sees it at, GPULINK_SHARE_MEMORY_<i>
// (bytes) and GPULINK_SHARE_CORES_<i> plus the strategy's limits:
//
//	MPS       CUDA_MPS_PIPE_DIRECTORY, a bind mount of that GPU's pipe
//	          directory, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<i>=<MiB>M,
//	          CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<cores>
//	HAMiCore  CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m, CUDA_DEVICE_SM_LIMIT_<i>=<cores>
//
// A share under strategy None (whole GPUs only) is refused, as the
// controller refuses to allocate it: claims kube-scheduler or anyone else
// allocated are held to the controller's rules.
//
// With real GPUs (nvml discovery) a missing device node fails the claim.
// With mock or topology-file discovery, nodes without GPUs, missing device
// nodes are left out of the spec and logged, so that the spec stays usable
// by containerd, and MPS shares get their directories but no daemon.
//
// A CUDA process talks to one MPS control daemon, which sees one GPU, so a
// claim with an MPS share must not contain other GPUs; a GPU cannot be in
// one claim both whole and as a share. Such claims, malformed or unknown
// configs, devices of other pools or not on this node, shares larger than
// the GPU, and devices already prepared for another claim (whole, or shares
// that would overcommit memory or cores) fail with an error naming the claim
// (namespace/name and UID) and the field, and leave nothing behind.
//
// # MPS daemons
//
// MPSManager counts references per GPU: the first share on a GPU starts
// `nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES=<uuid>,
// CUDA_MPS_PIPE_DIRECTORY=<mps-root>/<uuid>/pipe and
// CUDA_MPS_LOG_DIRECTORY=<mps-root>/<uuid>/log; releasing the last sends
// "quit". Daemons outlive plugin restarts; the references are rebuilt from
// the checkpoint and a running daemon is adopted.
//
// # Checkpoint
//
// Every prepared claim is recorded in <kubelet-plugin-dir>/checkpoint.json:
// a SHA-256 checksum over the payload, written to a temporary file and
// renamed into place (not synced: only a new boot can lose page-cache
// writes, and a new boot voids the checkpoint anyway) (the design of the kubelet's checkpointmanager,
// which lives in k8s.io/kubernetes and is not importable here). A claim is
// recorded as PrepareStarted before any side effect and as
// PrepareCompleted after its CDI spec is written; Prepare and Unprepare
// are idempotent. At startup:
//
//   - a checkpoint from another boot (boot ID changed) is discarded;
//   - claims in PrepareStarted are rolled back, stopping an MPS daemon
//     their interrupted prepare may have started unless another claim
//     holds it;
//   - CDI specs of claims that are not prepared are removed, and missing
//     specs of prepared claims are rewritten;
//   - a corrupt checkpoint (bad JSON, checksum mismatch, unknown version)
//     is moved aside to checkpoint.json.corrupt, logged as an error and
//     counted in gpulink_kubeletplugin_checkpoint_corruptions_total; the
//     plugin starts with no prepared claims and removes all its CDI specs.
//     Running containers keep their devices (CDI is applied at container
//     creation); new pods are prepared normally. What is lost: containers
//     that restart inside pods prepared before the corruption cannot
//     resolve their CDI device until the pod is recreated, and MPS daemons
//     of those claims are not stopped by their unprepare. Refusing to
//     start instead would block every GPU pod on the node until someone
//     deletes the file by hand.
package kubeletplugin

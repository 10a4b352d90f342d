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
// # MIG devices
//
// A GPU in MIG mode is not published as gpu-<index>: the whole-GPU
// devices are built from the node's other GPUs alone (their islands,
// groups and links rows leave it out, '.' in the row), so no whole-GPU
// set or share can land on it. Each of its existing MIG devices (compute
// instance CI in GPU instance GI) is a device gpu-<index>-mig-<GI>-<CI>
// (driver.MIGDeviceName), exclusive (no allowMultipleAllocations), with
// capacity memory (the profile's bytes, no request policy) and the
// attributes
//
//	type                          string  "mig"
//	profile                       string  nvidia-smi's name, e.g. "1g.5gb"
//	uuid                          string  the MIG device's "MIG-..." UUID
//	parentIndex, parentUUID       int, string  the GPU it is part of
//	gpuInstance, computeInstance  int     NVML's GI and CI IDs
//	placementStart, placementSize int     the GPU instance's memory slices
//	multiprocessors               int     SMs of the compute instance
//	copyEngines, decoders, encoders, jpegEngines, ofaEngines  int
//
// plus the parent's productName, architecture, cudaComputeCapability,
// driverVersion, numaNode and PCI attributes. GPUs not in MIG mode never
// get MIG devices; a node may mix both.
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
// limit to 64 devices per slice, which BuildDriverResources respects; so
// does --health, whose unhealthy taint may come at any time.
//
// # Prepare and CDI
//
// PrepareResourceClaims takes the results of driver gpu.gpulink.dev in the
// node's pool and the driver's opaque configs (class entries first, then
// the claim's, later entries overriding; an entry applies to all requests
// or to the listed ones), resolved with api/v1alpha1. The claim's entries
// may only narrow the class's sharing strategy and maxSharesPerGPU
// (v1alpha1.CheckClaimNarrows), the rule the controller applies too; it is
// checked here again because claims kube-scheduler allocated never went
// through the controller. It writes one
// transient CDI spec per claim (kind gpu.gpulink.dev/claim, file
// gpu.gpulink.dev-claim_<uid>.json in --cdi-root) with a CDI device per
// GPU of the claim, named <claim UID>-<device name> (e.g.
// gpu.gpulink.dev/claim=<uid>-gpu-3), and one claim device named after the
// claim UID. Each result of the claim gets its GPU's device first, then the
// base device (see "Driver files"), then the claim device; shares of one
// GPU get the same GPU device. A GPU's device holds its /dev/nvidia<minor>
// and GPULINK_DEVICE_<i>=<device name>, i being the ordinal the container
// sees the GPU at (always there, so that the device has edits on nodes
// without device nodes too). The claim device holds
// /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools (device nodes
// are under --driver-root when it has a dev directory, as a driver
// container's root does, else under /), NVIDIA_VISIBLE_DEVICES with exactly
// the claim's GPUs (UUIDs, indexes when unknown), CUDA_DEVICE_ORDER=PCI_BUS_ID
// and, per shared GPU at the ordinal the container sees it at,
// GPULINK_SHARE_MEMORY_<i> (bytes) and GPULINK_SHARE_CORES_<i> plus the
// strategy's limits:
//
//	MPS       CUDA_MPS_PIPE_DIRECTORY, bind mounts of the claim's MPS pipe
//	          directory and of its shm directory as /dev/shm,
//	          CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<i>=<MiB>M,
//	          CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<cores> (the limits are set
//	          on the claim's daemon; the env only repeats them)
//	HAMiCore  CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m, CUDA_DEVICE_SM_LIMIT_<i>=<cores>
//
// A claim whose shares set sharing.priority (one for all of them) also gets
// GPULINK_SHARE_PRIORITY and CUDA_MPS_CLIENT_PRIORITY (MPS) or
// CUDA_TASK_PRIORITY (HAMiCore) in its claim device (priority.go).
//
// A MIG device (prepare_mig.go) gets a CDI device of its own, even beside
// other MIG devices of the same GPU: the GPU's /dev/nvidia<minor>, the
// /dev/nvidia-caps/nvidia-cap<minor> nodes of its GPU and compute
// instance (minors from the driver's mig-minors table) and
// GPULINK_DEVICE_<i>; NVIDIA_VISIBLE_DEVICES names it by its MIG-<uuid>,
// never by the parent's UUID. It is exclusive; a share of it, a MIG device
// not on this node, of a GPU not in MIG mode, one without a known UUID,
// and a whole GPU or share of a GPU in MIG mode are refused naming the
// result's field and value.
//
// A share under strategy None (whole GPUs only) is refused, as the
// controller refuses to allocate it: claims kube-scheduler or anyone else
// allocated are held to the controller's rules.
//
// # The driver's files: the base spec
//
// A CUDA container also needs the user-space driver, which images such as
// nvidia/cuda do not contain. At start the plugin generates it with the
// NVIDIA Container Toolkit's nvcdi library from the driver root, as seen at
// --driver-root-mount, into one base spec per node (kind
// gpu.gpulink.dev/base, file gpu.gpulink.dev-base_driver.json, device
// gpu.gpulink.dev/base=driver), replacing the previous one atomically, and
// returns that device before the claim's device for every prepared claim.
// It holds what is the same for every claim: the driver's libraries
// (lib*.so.<version> in the root's lib directories; the version comes from
// NVML with nvml discovery, otherwise from the libcuda.so.<version> file
// name), binaries (nvidia-smi, nvidia-cuda-mps-control, ...), GSP
// firmware, the nvidia-persistenced and nvidia-fabricmanager sockets, and
// the nvidia-cdi-hook hooks (create-symlinks, update-ldcache,
// enable-cuda-compat, disable-device-node-modification). Host paths are
// rewritten from --driver-root-mount to --driver-root: the container
// runtime resolves them on the host. Left out of it and kept per claim:
// device nodes (no container may get a GPU it did not claim; the control
// nodes go with the claim so that a missing /dev/nvidia-uvm is handled at
// prepare) and NVIDIA_VISIBLE_DEVICES (nvcdi's "void" would race the
// claim's list in the runtime's merge).
//
// The hooks run the binary at --cdi-hook-path, a host path. By default the
// plugin copies the image's /usr/bin/nvidia-cdi-hook (--cdi-hook-source) to
// <kubelet-plugin-dir>/bin/nvidia-cdi-hook at start (temporary file and
// rename) and uses that: the plugin directory is a hostPath with the same
// path inside and outside the container, while the image's own copy has no
// stable host path (it lives in a snapshot that changes with every image),
// and a node needs no NVIDIA Container Toolkit install. update-ldcache
// runs the host's /sbin/ldconfig against the container's root, so images
// without ldconfig (static images) work; on hosts without it, leave the
// hook out with --cdi-disable-hooks=update-ldcache.
//
// With nvml discovery a driver root without a usable driver (no
// libcuda.so.<version> or libnvidia-ml.so.<version>), a missing hook or a
// bad flag stops the plugin at start with an error naming the path, rather
// than failing pods later. With mock or topology-file discovery (GPU-less
// nodes, the demo, tests) the driver root is optional: the plugin writes
// the base spec if it finds a driver there (point --driver-root at a fake
// tree to test the path), and otherwise logs why, removes a stale base
// spec and returns the claim device alone. --cdi-driver-files=false turns
// the base spec off.
//
// /dev/nvidia-uvm and /dev/nvidia-uvm-tools are created by nvidia-modprobe
// or the first CUDA process run as root, not by loading the module, so a
// freshly booted node can lack them. With nvml discovery prepare creates a
// missing one (char device, major of nvidia-uvm in /proc/devices, minor 0
// or 1, mode 0666, as nvidia-modprobe does) under the dev root as this
// process sees it; if the module is not loaded the claim fails with an
// error saying so. In the chart that dev root is the host's /dev seen
// through the driver-root mount.
//
// With real GPUs (nvml discovery) a missing device node fails the claim.
// With mock or topology-file discovery, nodes without GPUs, missing device
// nodes are left out of the spec and logged, so that the spec stays usable
// by containerd, and MPS shares get their directories but no daemon
// (mps.DirOnlyDaemon).
//
// A CUDA process talks to one MPS control daemon, which sees only the
// claim's MPS GPUs, so a claim with MPS shares must not contain whole GPUs
// or shares under another strategy, and its MPS shares must ask the same
// core percentage on each GPU (one per MPS server); a GPU cannot be in one
// claim both whole and as a share. Such claims, malformed or unknown
// configs, devices of other pools or not on this node, shares larger than
// the GPU, and devices already prepared for another claim (whole, or shares
// that would overcommit memory or cores) fail with an error naming the claim
// (namespace/name and UID) and the field, and leave nothing behind.
//
// # MPS daemons
//
// Every claim with an MPS share gets an MPS control daemon of its own
// (mps.Manager counts references per claim, one per MPS result; mps.Daemon
// is the seam tests fake). Why per claim and not per GPU: MPS limits are
// per server. The control daemon spawns one server per client UID and
// gives each new server its defaults (set_default_device_pinned_mem_limit,
// set_default_active_thread_percentage); a client's CUDA_MPS_* env can only
// lower what its server allows. Per-client-PID limits do not exist and the
// per-server commands (set_device_pinned_mem_limit <server pid>) address
// servers, not claims. With one daemon per GPU, two claims of the same UID
// would land in one server with one limit, and claims of different UIDs
// would wait for each other's server to exit. With one daemon per claim,
// started with the claim's limits as its defaults before any container of
// the claim exists, every server it ever spawns carries exactly the
// claim's limits, whatever the container puts into its env. What that does
// not cover: a process that drops CUDA_MPS_PIPE_DIRECTORY bypasses MPS
// and uses the GPU directly (it has the device node); only the
// EXCLUSIVE_PROCESS compute mode prevents that, and it admits one MPS
// server per GPU, which per-claim daemons (and other UIDs) need more of.
//
// A claim with MPS shares on several GPUs (HAMi's nvidia.com/gpu: 2 with
// gpumem, translated into one request of count 2) still has one daemon,
// serving all its MPS GPUs (mps.Share.GPUs). It is started with
// CUDA_VISIBLE_DEVICES listing them in the order the claim's containers
// number them (claimGPUs: PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID
// makes CUDA number NVIDIA_VISIBLE_DEVICES). NVIDIA's MPS guide
// ("Appendix: Environment Variables", CUDA_VISIBLE_DEVICES) says the
// devices visible to the control daemon are remapped by the MPS server, so
// its clients see them as devices 0..n-1 in list order; that is the
// ordinal set_default_device_pinned_mem_limit <dev> <limit> takes, one
// command per GPU, and the ordinal in the container's
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=8000M,1=8000M"). The active thread
// percentage is one per server (set_default_active_thread_percentage has
// no device), so the plugin refuses a claim whose MPS shares ask different
// core percentages on different GPUs (checkClaimShape) rather than giving
// a GPU less than it was allocated; the controller does not allocate such
// a claim in the first place (it places it where the cores come out equal,
// or says why it waits). Not verified on a GPU here.
//
// A container that uses several claims gets each claim's CDI devices, and
// the last value of a variable wins. The controller names the claims that
// every container using one of them uses together (annotation
// gpu.gpulink.dev/container-claims, set only on claims from the pod's own
// templates); when the annotation holds for every claim of the group in
// the kubelet's call, each claim's spec numbers all the group's GPUs as one
// set (NVIDIA_VISIBLE_DEVICES, GPULINK_DEVICE_<i>, the share variables), and
// the checkpoint keeps the peers' GPUs to rebuild it (containergroup.go).
//
// MPS shares beside GPUs outside MPS in one claim (a whole GPU and an MPS
// share, or MPS and HAMi-core shares) get a CDI view per request
// (cdiviews.go): the MPS variables go only to the MPS request's
// containers, since a CUDA process with CUDA_MPS_PIPE_DIRECTORY set sees
// the server's GPUs only, and each request numbers its GPUs from 0.
//
// Where it runs: in a pod per claim that the plugin creates through the API
// (mps.PodDaemon): gpulink-mps-<claim UID> in the plugin's namespace
// (--mps-daemon-namespace, the chart passes the downward API's namespace),
// bound to the node with spec.nodeName, tolerating every taint, restart
// policy Never, unprivileged (device nodes from the MPS daemon device
// plugin, below), owned by the Node (garbage collected with it; not by the
// plugin's pod, which an upgrade replaces). The image is the plugin's own
// (--mps-daemon-image), which provides only glibc: the program is
// nvidia-cuda-mps-control -f from the driver root (host --driver-root
// mounted read-only at /driver-root in the pod), run with LD_LIBRARY_PATH of the
// driver's library directories, PATH with its bin directory,
// CUDA_VISIBLE_DEVICES=<the claim's GPU UUIDs>, CUDA_MPS_PIPE_DIRECTORY and
// CUDA_MPS_LOG_DIRECTORY under <mps-root>/<claim UID>/ on a hostPath (same
// path in the plugin, the daemon pod and the claim's containers, so the
// pipe names the client computes match), and <mps-root>/<claim UID>/shm
// as its /dev/shm. The binary and libcuda.so.1 are looked up at plugin
// start; when missing (or no image is configured) the plugin still starts
// and serves whole GPUs, and every MPS claim fails naming the cause.
//
// Why a pod and not a child process: a child of the plugin lives in the
// plugin container's cgroup, and runc kills every process in it when the
// container stops, hostPID or not, so every plugin restart or helm upgrade
// would kill the servers of running clients. Escaping that cgroup from the
// plugin (nsenter into PID 1's namespaces, systemd-run on the host) needs
// host privileges beyond the device access the plugin has and would leave
// processes that nothing in the cluster shows or cleans up. A pod is
// visible (kubectl get pods -l app.kubernetes.io/component=mps-control-daemon),
// its logs and state are the kubelet's, it outlives the plugin, and the
// Node owner reference removes it if the node goes away. The price: a
// prepare waits for a pod start (the image is already on the node, since
// the plugin runs from it), and the plugin needs create/get/delete on pods
// in its own namespace.
//
// The daemon and the server it spawns open the claim's GPUs' device nodes,
// /dev/nvidiactl and the uvm nodes. Kubernetes gives an unprivileged
// container host device nodes only through a device plugin or a DRA claim
// of its own (the claim is the user's pods'; a second consumer would show
// up in its reservedFor and the controller's accounting), so the plugin
// also serves a kubelet device plugin (mps.DevicePlugin, v1beta1 API)
// wherever daemon pods run (nvml discovery; --mps-device-plugin turns it
// on with simulated GPUs for tests): one extended resource per GPU,
// mps-daemon.gpu.gpulink.dev/gpu-<index>, so that a pod can ask for
// exactly its claim's GPUs, with mps.DefaultDaemonSlots (64) device IDs
// each, since the daemons of several claims share a GPU. Allocate returns
// the GPU's /dev/nvidia<minor> and the three control nodes (permissions
// rw, host paths under the driver root's dev directory as in the CDI
// specs), nothing else, and refuses IDs that are not that GPU's slots. It
// registers at <--kubelet-device-plugin-dir>/kubelet.sock, one socket per
// GPU (gpulink-mps-gpu-<index>.sock), and registers again when kubelet.sock
// is replaced or its sockets vanish (a kubelet restart deletes them) or the
// GPUs change. The daemon pod asks for limits of 1 of each of its GPUs'
// resources and runs with allowPrivilegeEscalation false and every
// capability dropped; the image's user is not root, so it had no
// effective capability in the privileged container either. A daemon pod
// created while the device plugin is not registered (the kubelet just
// restarted) is refused by the kubelet's admission and fails: the prepare
// fails with the pod's state and the kubelet retries it. Only the plugin's
// daemon pods may ask for these resources (the chart's admission policies,
// docs/security.md). Not run on a GPU here.
//
// Start creates the pod, or adopts the one that exists (plugin restart:
// recovery takes every checkpointed claim's reference again, which lands
// here), waits until `get_server_list` succeeds through the pipe
// directory (or the pod ends, or 60 s pass), and then sends the claim's
// limits as the daemon's defaults: the thread percentage once, a pinned
// memory limit for each device ordinal it sees (on adoption too:
// idempotent). If anything fails, the error carries the
// pod's container state and the tail of the daemon's control.log, the pod
// and the directories are deleted, and prepare fails the claim: its
// checkpoint entry and CDI spec are removed (prepare.go), and the kubelet
// reports the error as a FailedPrepareDynamicResources warning event on
// the pod. A pod of the same claim that is still terminating is not
// adopted: prepare fails and the kubelet's retry succeeds once it is gone.
// A pod that existed before the call (adoption after a plugin restart) and
// then fails the checks is kept, not deleted, because it may serve running
// containers (mps.ErrDaemonKept); its reference is kept too, so the claim's
// unprepare (or the rollback of a failed prepare) deletes it.
// Stop deletes the pod (the daemon and the server die with it) and the
// directories.
//
// Isolation: the pipe and shm directories of a claim are mounted into the
// containers of that claim only, so no tenant can reach another claim's
// daemon (quit, set_* commands) or server. The pipe mount is read-write:
// MPS clients create and open FIFOs in it; what a container can do there is
// limited to its own claim's daemon. A container can stop its own daemon
// (echo quit): it only hurts itself. Different UIDs inside one claim (a
// claim shared by pods, or containers with different runAsUser) still make
// MPS serialise their servers: the second UID's clients wait until the
// first UID's clients exit. Containers sharing one MPS claim must run as
// the same UID: the controller keeps a pod gated (event MPSUsersDiffer)
// while the containers that would share its MPS claim set different
// runAsUser values (controller/mpsusers.go, from its pod cache), so that
// no GPU node needs to read pods; a UID that only the image sets cannot be
// seen there, which the README says.
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
//   - claims in PrepareStarted are rolled back, stopping the MPS daemon
//     their interrupted prepare may have started;
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
//
// Each result records its GPU's CDI device (devices[].cdiDeviceID). A
// checkpoint written before per-GPU CDI devices lacks it; such a claim
// keeps the layout it was prepared with: it is answered with its old CDI
// IDs (base and claim device), its spec is neither rewritten nor, when
// restored at startup, given per-GPU devices (the kubelet may start
// containers with the IDs it got then, whose claim device must still hold
// the GPUs' device nodes), and it unprepares as before. The next prepare
// of a new claim gets per-GPU devices. A version without the field reads a
// newer checkpoint as corrupt (unknown field), with the consequences above.
//
// # Per-pod metrics
//
// gpulink_kubeletplugin_prepared_gpu_info has one series per GPU of each
// PrepareCompleted claim and pod in the claim's reservedFor (labels
// PreparedGPUInfoLabels; the GPU's UUID as label UUID, as dcgm-exporter
// names it, so that DCGM_FI_* series join on it). The pods are recorded in
// the checkpoint (pods, refreshed whenever the kubelet asks for the claim
// again), so the series follow prepare and unprepare and are rebuilt at
// restart. The collector serves a snapshot taken at every checkpoint
// write: a scrape never waits for a prepare (podmetrics.go says what is
// not known: the container, pods reserving a claim after its prepare).
//
// # Shutdown
//
// On SIGTERM the plugin stops serving and unregisters (the helper's Stop
// removes its registration socket) but deletes neither its ResourceSlices
// nor its checkpoint and CDI specs. The kubelet deletes the slices of a
// driver that has unregistered and not registered again within 30 s
// (defaultWipingDelay of its DRA manager; at its own start it deletes
// those of every driver), so `helm uninstall` leaves no slices of the
// node behind, while a restart or a rolling upgrade of the DaemonSet pod,
// whose replacement registers within those 30 s, keeps the node's GPUs
// published throughout. Deleting the slices at shutdown would withdraw
// every GPU of the node from allocation at each upgrade, and a pre-delete
// hook could not write them anyway: the slice admission policy lets only
// the node's own plugin identity change its node's slices. In the 30 s
// after an uninstall nothing allocates the stale slices: their devices
// carry the managed-by-controller taint (--managed-by-controller, on by
// default), which kube-scheduler does not tolerate, and the controller is
// gone with the release. The e2e test (TestHelmInstallOnRealNode) checks both:
// prepared claims survive `helm upgrade`, and no slice of the node is left
// after `helm uninstall`.
//
// # Rolling updates
//
// With --rolling-update-uid (the chart passes the pod's UID) the plugin
// registers under a socket name of its own, so the chart's DaemonSet
// starts the new pod beside the old one (maxSurge 1, maxUnavailable 0)
// and the node prepares claims throughout an upgrade. The instances share
// the plugin directory: each prepare and unprepare call, the recovery at
// start and the MPS limit loop hold an flock on checkpoint.lock and read
// the checkpoint again when the other instance wrote it, following its
// MPS daemon references; only the holder of publisher.lock publishes
// ResourceSlices (rolling.go says why each).
//
// # Device health
//
// With --health (the default) the plugin watches its GPUs and acts on what
// package driver/health decides an event means:
//
//	fatal    XIDs in --health-fatal-xids (default 48, 62, 63, 64, 74, 79,
//	         92, 94, 95, 119, 120: the XIDs after which NVIDIA's catalog
//	         says the GPU needs a reset; driver/health lists why each),
//	         double-bit ECC errors, a GPU lost (fallen off the bus), a
//	         failed row remap
//	warning  thermal slowdown, and any XID in neither list
//	ignored  XIDs in --health-ignored-xids (default 13, 31, 43, 45, 68,
//	         109: caused by the application, the GPU is fine)
//
// A fatal event sets a condition on the GPU ("xid-79", "gpu-lost", ...).
// While a GPU has one, its device carries the taint
// gpu.gpulink.dev/unhealthy=<condition>:<effect> (--health-taint-effect:
// NoSchedule keeps new claims off it, the controller and kube-scheduler
// both honour device taints; NoExecute also makes kube-controller-manager
// evict the pods using it, TestE2EHealthNoExecute), the slices are republished at once, the
// kubelet's WatchHealthStatus stream (KEP-4680) reports the device
// Unhealthy, so pods show it in
// status.containerStatuses[].allocatedResourcesStatus (the kubelet's
// ResourceHealthStatus feature gate is beta and on by default in 1.37), a
// Warning event GPUUnhealthy is recorded on the Node and the
// gpulink_kubeletplugin_device_healthy gauge drops to 0. Warnings get a
// GPUWarning event and a count in gpulink_kubeletplugin_health_events_total.
// Reports go to the kubelet at every change and every 20s (valid 60s).
// The kubelet keys allocatedResourcesStatus by a device's first CDI
// device ID, which is the GPU's own CDI device
// (gpu.gpulink.dev/claim=<claim UID>-<device name>), so a pod shows the
// health of each GPU of its claims (shares of one GPU are one entry).
// Claims prepared by gpulink versions before per-GPU CDI devices keep the
// CDI IDs they were prepared with until they are unprepared (see
// "Checkpoint"): their GPUs share one entry, the first GPU's health.
//
// Sources (HealthSource):
//
//	nvml  real GPUs: an NVML event set for XID critical errors and
//	      double-bit ECC errors; every --health-poll-interval,
//	      NVML_ERROR_GPU_IS_LOST (GPU lost), GetRemappedRows (remap
//	      failure) and the clock event reasons (thermal slowdown)
//	file  --health-events-file (default <kubelet-plugin-dir>/
//	      health-events.jsonl), on every backend: JSON lines appended to
//	      it, such as {"device":"gpu-1","kind":"xid","xid":79} or
//	      {"uuid":"GPU-...","kind":"gpu-lost"}. Tests make simulated GPUs
//	      unhealthy this way; lines present when the plugin starts were
//	      applied before and are skipped.
//
// Recovery: the nvml source clears gpu-lost when the GPU answers again
// and row-remap-failure when GetRemappedRows no longer reports one (after
// a reset). XID and ECC conditions need an operator, after resetting or
// replacing the GPU: appending {"device":"gpu-1","kind":"recovered"}
// (every condition) or {"device":"gpu-1","kind":"recovered",
// "condition":"xid-79"} to the events file on the node. Then the taint
// goes, a Normal GPURecovered event is recorded and the kubelet hears the
// device is healthy. Conditions are kept in <kubelet-plugin-dir>/
// health.json across plugin restarts and dropped when the node reboots
// (its boot ID changes), which resets the GPUs.
//
// If a source cannot read the GPUs at all (NVML does not initialise, its
// event set fails), the kubelet is told every device's health is Unknown,
// not Healthy, and /healthz on the metrics port fails, so the chart's
// liveness probe restarts the plugin.
package kubeletplugin

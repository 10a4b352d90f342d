package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Identity of the configuration type; Decode accepts nothing else.
const (
	GroupName = "gpu.gpulink.dev"
	Version   = "v1alpha1"
	Kind      = "GpuConfig"
)

// APIVersion is the value the apiVersion field must carry.
const APIVersion = GroupName + "/" + Version

// GpuConfig is the opaque configuration of driver gpu.gpulink.dev.
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Topology says how strictly the links between the GPUs of one
	// request are enforced.
	Topology *TopologyConfig `json:"topology,omitempty"`
	// Sharing says how a GPU given out in shares is partitioned.
	Sharing *SharingConfig `json:"sharing,omitempty"`
	// Placement packs or spreads this claim's devices, across nodes and
	// across the GPUs of a node; unset fields follow the controller's
	// cluster-wide flags (--node-packing, --gpu-packing).
	Placement *PlacementConfig `json:"placement,omitempty"`
}

// PlacementStrategy packs work tightly or spreads it out.
type PlacementStrategy string

const (
	// PlacementBinpack fills the busiest node (or GPU, for shares) that
	// still fits, keeping whole nodes and GPUs free for large jobs.
	PlacementBinpack PlacementStrategy = "Binpack"
	// PlacementSpread places work on the least-used node (or GPU).
	PlacementSpread PlacementStrategy = "Spread"
)

// PlacementConfig is a claim's own packing policy (HAMi's per-pod
// hami.io/node-scheduler-policy and hami.io/gpu-scheduler-policy).
type PlacementConfig struct {
	// Node chooses among the nodes that fit.
	Node PlacementStrategy `json:"node,omitempty"`
	// GPU chooses among the GPUs of a node for shares.
	GPU PlacementStrategy `json:"gpu,omitempty"`
}

// TopologyPolicy says whether a link requirement is a preference or a must.
type TopologyPolicy string

const (
	// TopologyBestEffort picks the best-connected GPUs available but never
	// fails a request because of its links.
	TopologyBestEffort TopologyPolicy = "BestEffort"
	// TopologyRequired fails a request unless every pair of its GPUs is
	// connected by at least MinLink.
	TopologyRequired TopologyPolicy = "Required"
)

// TopologyConfig is the link policy for multi-GPU requests.
type TopologyConfig struct {
	Policy TopologyPolicy `json:"policy,omitempty"`
	// MinLink is the slowest acceptable link class between any two GPUs of
	// the request: "NVLink" (any NVLink bond), "NV1".."NV18", "PIX", "PXB",
	// "PHB", "NODE" or "SYS". Required iff Policy is Required.
	MinLink string `json:"minLink,omitempty"`
}

// SharingStrategy is the mechanism that confines a share to its part of a GPU.
type SharingStrategy string

const (
	// SharingMPS runs an MPS control daemon per GPU and limits each client
	// with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
	SharingMPS SharingStrategy = "MPS"
	// SharingHAMiCore relies on the HAMi-core interception library and sets
	// CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT_<i>.
	SharingHAMiCore SharingStrategy = "HAMiCore"
	// SharingNone gives out no shares: only whole GPUs.
	SharingNone SharingStrategy = "None"
)

// SharingConfig sizes the shares of one GPU.
type SharingConfig struct {
	// Strategy is how shares are confined. Only a DeviceClass chooses it:
	// a claim may set it only to its class's effective strategy.
	Strategy SharingStrategy `json:"strategy,omitempty"`
	// DefaultMemory is the GPU memory a share gets when its request does
	// not ask for the memory capacity.
	DefaultMemory *resource.Quantity `json:"defaultMemory,omitempty"`
	// DefaultCores is the percentage of the GPU's SMs (1..100) a share gets
	// when its request does not ask for the cores capacity.
	DefaultCores *int64 `json:"defaultCores,omitempty"`
	// MaxSharesPerGPU caps how many shares one GPU carries at a time. A
	// claim may lower its class's cap for its own shares, never raise it.
	MaxSharesPerGPU *int `json:"maxSharesPerGPU,omitempty"`
	// MemoryOvercommitPercent lets the memory of the shares of one GPU add
	// up to this percentage of its memory (HAMi's deviceMemoryScaling × 100):
	// 100, the default, allows no over-commit; at most 400. An explicit
	// opt-in of the DeviceClass (the operator): a claim may only lower it.
	// A share of a class without it never lands on a GPU whose shares
	// would then exceed its memory. Cores are never over-committed.
	MemoryOvercommitPercent *int `json:"memoryOvercommitPercent,omitempty"`
	// Priority is the task priority of the share's processes, HAMi's
	// nvidia.com/priority: 0 (PriorityHigh) or 1 (PriorityLow). Under MPS it
	// becomes CUDA_MPS_CLIENT_PRIORITY (0 normal, 1 below normal), under
	// HAMi-core CUDA_TASK_PRIORITY. Unset leaves the mechanism's own default
	// (MPS: normal). MPS orders only the clients of one server: under
	// mpsMode Isolated every MPS claim has a server of its own, so it orders
	// a claim's processes among themselves, not against other claims on the
	// GPU; under mpsMode Concurrent it orders the clients of every claim of
	// the claim's group (its namespace) on the GPU.
	Priority *int `json:"priority,omitempty"`
	// MPSMode says which MPS shares of a GPU share an MPS server (strategy
	// MPS only; DefaultMPSMode, Isolated, when unset). Only a DeviceClass
	// chooses it: a claim may set it only to its class's effective mode.
	// See the MPSMode values and docs/mps.md.
	MPSMode MPSMode `json:"mpsMode,omitempty"`
}

// MPSMode chooses between isolation and concurrency for the MPS shares of
// one GPU. The contexts of different MPS servers are time-sliced by the
// GPU; the clients of one server run at the same time.
type MPSMode string

const (
	// MPSIsolated gives every claim an MPS control daemon (and so a
	// server) of its own, whose limits the plugin sets on the daemon and
	// sets again periodically: a container cannot raise them for long, and
	// a claim's shares run time-sliced against other claims' on the GPU.
	MPSIsolated MPSMode = "Isolated"
	// MPSConcurrent gives the claims of one sharing group on one GPU one
	// MPS control daemon, so their kernels run at the same time. The group
	// is the claim's namespace. The limits are each client's own
	// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
	// in its environment), which a container of the group can raise: the
	// group shares the GPU as one tenant. So a GPU with Concurrent shares
	// carries no other share than Concurrent MPS shares of the same group,
	// a claim's Concurrent shares sit on one GPU (an MPS client reaches one
	// server), and the group's containers on a GPU must run as one UID (MPS
	// runs one server per user).
	MPSConcurrent MPSMode = "Concurrent"
)

// ConcurrentMPS tells whether a resolved (defaulted) sharing configuration
// gives MPS shares whose group shares one MPS server per GPU: strategy MPS
// and mpsMode Concurrent. False for nil.
func (s *SharingConfig) ConcurrentMPS() bool {
	return s != nil && s.Strategy == SharingMPS && s.MPSMode == MPSConcurrent
}

// ConcurrentMPS tells whether a resolved configuration (Resolve,
// ResolveDecoded) gives Concurrent MPS shares; see SharingConfig.ConcurrentMPS.
func (c *GpuConfig) ConcurrentMPS() bool {
	return c != nil && c.Sharing.ConcurrentMPS()
}

// The two task priorities HAMi knows, and the values
// SharingConfig.Priority accepts.
const (
	PriorityHigh = 0
	PriorityLow  = 1
)

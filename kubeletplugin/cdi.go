package kubeletplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// CDI names: one transient spec per claim, holding one device named after
// the claim UID (the edits the claim's GPUs share) and one per GPU of the
// claim, named <claim UID>-<device name> (that GPU's own edits). Claim
// UIDs are never reused, so container runtimes that cache specs cannot hit
// a stale entry.
const (
	CDIVendor = driver.Name
	CDIClass  = "claim"
	CDIKind   = CDIVendor + "/" + CDIClass
)

// CDIDeviceID returns the qualified CDI device name of a claim.
func CDIDeviceID(claimUID types.UID) string {
	return cdiparser.QualifiedName(CDIVendor, CDIClass, string(claimUID))
}

// cdiGPUDeviceName is the name of the CDI device of one GPU (DRA device
// name, e.g. gpu-3) of a claim in the claim's spec.
func cdiGPUDeviceName(claimUID types.UID, device string) string {
	return string(claimUID) + "-" + device
}

// CDIDeviceIDForDevice returns the qualified CDI device name of one GPU of
// a claim. It comes first in that GPU's CDI device IDs, and the kubelet
// names the GPU by its first CDI device ID in a pod's
// allocatedResourcesStatus, so every GPU of a claim reports its own health.
func CDIDeviceIDForDevice(claimUID types.UID, device string) string {
	return cdiparser.QualifiedName(CDIVendor, CDIClass, cdiGPUDeviceName(claimUID, device))
}

// CDIWriter stores the per-claim CDI specs.
type CDIWriter interface {
	// WriteClaimSpec writes (or replaces) the spec of a claim.
	WriteClaimSpec(claimUID types.UID, spec *cdispec.Spec) error
	// RemoveClaimSpec removes the spec of a claim; a missing one is fine.
	RemoveClaimSpec(claimUID types.UID) error
	// ListClaimSpecs returns the UIDs of all claims that have a spec.
	ListClaimSpecs() ([]types.UID, error)
	// WriteBaseSpec writes (or replaces) the node's base spec.
	WriteBaseSpec(spec *cdispec.Spec) error
	// RemoveBaseSpec removes the base spec; a missing one is fine.
	RemoveBaseSpec() error
}

// CDIDir writes specs with the CDI library into one directory.
type CDIDir struct {
	dir   string
	cache *cdiapi.Cache
}

// NewCDIDir manages the gpulink claim specs in dir (created if missing).
func NewCDIDir(dir string) (*CDIDir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating CDI directory: %w", err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("creating CDI cache for %s: %w", dir, err)
	}
	return &CDIDir{dir: dir, cache: cache}, nil
}

func specFileName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(CDIVendor, CDIClass, string(claimUID)) + ".json"
}

// WriteClaimSpec implements CDIWriter; the library validates the spec and
// writes it atomically.
func (c *CDIDir) WriteClaimSpec(claimUID types.UID, spec *cdispec.Spec) error {
	if err := c.cache.WriteSpec(spec, specFileName(claimUID)); err != nil {
		return fmt.Errorf("writing CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// baseSpecFileName is not a transient claim spec name, so ListClaimSpecs
// never mistakes it for a claim's.
var baseSpecFileName = cdiapi.GenerateTransientSpecName(CDIVendor, CDIBaseClass, CDIBaseDevice) + ".json"

// WriteBaseSpec implements CDIWriter: validated and written atomically
// (temporary file and rename) by the CDI library, so the runtime never
// reads half a spec.
func (c *CDIDir) WriteBaseSpec(spec *cdispec.Spec) error {
	if err := c.cache.WriteSpec(spec, baseSpecFileName); err != nil {
		return fmt.Errorf("writing base CDI spec: %w", err)
	}
	return nil
}

// RemoveBaseSpec implements CDIWriter.
func (c *CDIDir) RemoveBaseSpec() error {
	if err := c.cache.RemoveSpec(baseSpecFileName); err != nil {
		return fmt.Errorf("removing base CDI spec: %w", err)
	}
	return nil
}

// RemoveClaimSpec implements CDIWriter.
func (c *CDIDir) RemoveClaimSpec(claimUID types.UID) error {
	if err := c.cache.RemoveSpec(specFileName(claimUID)); err != nil {
		return fmt.Errorf("removing CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// ListClaimSpecs implements CDIWriter.
func (c *CDIDir) ListClaimSpecs() ([]types.UID, error) {
	entries, err := os.ReadDir(c.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing CDI directory: %w", err)
	}
	prefix := cdiapi.GenerateTransientSpecName(CDIVendor, CDIClass, "")
	var uids []types.UID
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		uid := strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json")
		if uid != "" {
			uids = append(uids, types.UID(uid))
		}
	}
	return uids, nil
}

// Dir is the directory the specs are written to.
func (c *CDIDir) Dir() string { return c.dir }

// cdiOptions say how container edits are built.
type cdiOptions struct {
	// Root locates device nodes: under the driver root when it has a dev
	// directory, else under / (DriverRoot.devRoots).
	Root DriverRoot
	// RequireDeviceNodes makes a missing device node an error; otherwise
	// it is left out of the spec and logged (nodes without GPUs).
	RequireDeviceNodes bool
	// Stat stats a host path, following symlinks (os.Stat).
	Stat func(path string) (os.FileInfo, error)
	// UVM creates a missing /dev/nvidia-uvm or /dev/nvidia-uvm-tools when
	// device nodes are required; nil: a missing one is handled like any
	// other missing node.
	UVM *UVMNodeCreator
	// MPSDirs locates a GPU's MPS daemon directories.
	MPSDirs func(mps.Share) mps.Dirs
}

// claimGPU is one GPU of a claim with everything its container edits need.
type claimGPU struct {
	index, minor   int
	uuid, pciBusID string
	device         string         // DRA device name (gpu-<index>)
	share          *PreparedShare // nil: whole GPU
	// mig is set for a MIG device (device gpu-<index>-mig-<gi>-<ci>,
	// uuid its own): one GPU may hold several of a claim's.
	mig *PreparedMIG
}

// claimGPUs folds a claim's results into its distinct GPUs in the order a
// CUDA process inside the container numbers them (CUDA_DEVICE_ORDER is set
// to PCI_BUS_ID; without bus IDs the index order is the same order). Shares
// of one GPU add up; MIG devices of one GPU stay apart (folded by device
// name, which is the same for every share of a GPU).
func claimGPUs(c *PreparedClaim) []claimGPU {
	return foldGPUs(c.Devices)
}

// foldGPUs is claimGPUs over some of a claim's results.
func foldGPUs(devices []PreparedDevice) []claimGPU {
	byDevice := map[string]*claimGPU{}
	var order []string
	for _, d := range devices {
		g := byDevice[d.Device]
		if g == nil {
			g = &claimGPU{index: d.Index, minor: d.Minor, uuid: d.UUID, pciBusID: d.PCIBusID, device: d.Device, mig: d.MIG}
			byDevice[d.Device] = g
			order = append(order, d.Device)
		}
		if d.Share == nil {
			continue
		}
		if g.share == nil {
			s := *d.Share
			g.share = &s
			continue
		}
		g.share.MemoryBytes += d.Share.MemoryBytes
		g.share.Cores = min(g.share.Cores+d.Share.Cores, sliceformat.CoresTotal)
	}
	out := make([]claimGPU, 0, len(order))
	for _, name := range order {
		out = append(out, *byDevice[name])
	}
	allBus := true
	for _, g := range out {
		if g.pciBusID == "" {
			allBus = false
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if allBus && !strings.EqualFold(out[i].pciBusID, out[j].pciBusID) {
			return strings.ToLower(out[i].pciBusID) < strings.ToLower(out[j].pciBusID)
		}
		if out[i].index != out[j].index {
			return out[i].index < out[j].index
		}
		// MIG devices of one GPU: by name, so the order is stable.
		return out[i].device < out[j].device
	})
	return out
}

// buildClaimSpec builds the CDI spec of a prepared claim: its GPUs' device
// nodes and the control nodes, NVIDIA_VISIBLE_DEVICES with exactly the
// claim's GPUs, and the limits of its shares.
//
// With per-GPU CDI devices (pc.perGPUCDI, every claim prepared since they
// exist) the spec has one device per GPU holding that GPU's
// /dev/nvidia<minor> and GPULINK_DEVICE_<ordinal>=<device name> (always
// there, so the device's edits are never empty, even on nodes without the
// device node), and the claim device with everything else. Claims prepared
// before keep the layout their containers were started with: one claim
// device holding it all. A claim that mixes MPS shares with other GPUs
// also gets a view per request (cdiviews.go), which holds what differs
// between its requests' containers.
func buildClaimSpec(logger klog.Logger, c *PreparedClaim, o cdiOptions) (*cdispec.Spec, error) {
	gpus := claimGPUs(c)
	perGPU := c.perGPUCDI()
	views := perGPU && c.needsRequestViews()
	edits := cdispec.ContainerEdits{}
	devMount, devHost := o.Root.DevRoots()
	addNode := func(edits *cdispec.ContainerEdits, path string) error {
		host := filepath.Join(devHost, path)
		seen := filepath.Join(devMount, path)
		n, err := charDevice(o.Stat, path, seen, host)
		if _, uvm := uvmMinors[path]; err != nil && uvm && o.RequireDeviceNodes && o.UVM != nil && errors.Is(err, os.ErrNotExist) {
			if cerr := o.UVM.Ensure(path, seen); cerr != nil {
				return fmt.Errorf("device node %s is missing and cannot be created: %w", host, cerr)
			}
			n, err = charDevice(o.Stat, path, seen, host)
		}
		if err != nil {
			if o.RequireDeviceNodes {
				return fmt.Errorf("device node %s: %w", host, err)
			}
			logger.V(2).Info("Device node missing on this node, leaving it out of the CDI spec", "claim", klog.KRef(c.Namespace, c.Name), "hostPath", host, "reason", err)
			return nil
		}
		edits.DeviceNodes = append(edits.DeviceNodes, n)
		return nil
	}
	seen, ordinals := containerNumbering(c, gpus, views)
	var devices []cdispec.Device
	for _, g := range gpus {
		node := "/dev/nvidia" + strconv.Itoa(g.minor)
		if perGPU {
			dev := cdispec.Device{
				Name: cdiGPUDeviceName(c.UID, g.device),
				ContainerEdits: cdispec.ContainerEdits{
					Env: []string{"GPULINK_DEVICE_" + strconv.Itoa(ordinals[g.device]) + "=" + g.device},
				},
			}
			if err := addNode(&dev.ContainerEdits, node); err != nil {
				return nil, err
			}
			if err := addMIGNodes(&dev.ContainerEdits, g, addNode); err != nil {
				return nil, err
			}
			devices = append(devices, dev)
		} else if err := addNode(&edits, node); err != nil {
			return nil, err
		}
	}
	for _, p := range driver.ControlDeviceNodes() {
		if err := addNode(&edits, p); err != nil {
			return nil, err
		}
	}
	edits.Env = append(edits.Env, "NVIDIA_VISIBLE_DEVICES="+visibleDevices(seen), "CUDA_DEVICE_ORDER=PCI_BUS_ID")
	if !views {
		if err := addShareEdits(&edits, c, seen, o); err != nil {
			return nil, err
		}
	} else {
		for _, r := range c.viewRequests() {
			rgpus := foldGPUs(c.requestDevices(r))
			view := cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + visibleDevices(rgpus)}}
			for i, g := range rgpus {
				view.Env = append(view.Env, "GPULINK_DEVICE_"+strconv.Itoa(i)+"="+g.device)
			}
			if err := addShareEdits(&view, c, rgpus, o); err != nil {
				return nil, fmt.Errorf("request %s: %w", r, err)
			}
			devices = append(devices, cdispec.Device{Name: cdiViewDeviceName(c.UID, r), ContainerEdits: view})
		}
	}
	spec := &cdispec.Spec{
		Kind: CDIKind,
		Annotations: map[string]string{
			driver.Name + "/claim": c.Namespace + "/" + c.Name,
		},
		Devices: append([]cdispec.Device{{Name: string(c.UID), ContainerEdits: edits}}, devices...),
	}
	addPriorityEdits(&spec.Devices[0].ContainerEdits, c) // priority.go
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// visibleDevices is NVIDIA_VISIBLE_DEVICES for some GPUs: UUIDs, indexes
// where a UUID is unknown.
func visibleDevices(gpus []claimGPU) string {
	visible := make([]string, 0, len(gpus))
	for _, g := range gpus {
		if g.uuid != "" {
			visible = append(visible, g.uuid)
		} else {
			visible = append(visible, strconv.Itoa(g.index))
		}
	}
	return strings.Join(visible, ",")
}

// addShareEdits adds the share variables of gpus, numbered in their order,
// and the strategies' limits: for MPS shares the claim's daemon (whose
// GPUs are numbered in the same order: the MPS GPUs of the claim, or of
// its MPS request when it has views; a Concurrent share's one GPU is 0 in
// both) and the client's limits.
func addShareEdits(edits *cdispec.ContainerEdits, c *PreparedClaim, gpus []claimGPU, o cdiOptions) error {
	var mpsLimits []string
	for ordinal, g := range gpus {
		if g.share == nil {
			continue
		}
		mib := g.share.MemoryBytes / sliceformat.MemoryStep
		ord := strconv.Itoa(ordinal)
		edits.Env = append(edits.Env,
			"GPULINK_SHARE_MEMORY_"+ord+"="+strconv.FormatInt(g.share.MemoryBytes, 10),
			"GPULINK_SHARE_CORES_"+ord+"="+strconv.FormatInt(g.share.Cores, 10),
		)
		switch g.share.Strategy {
		case apiv1alpha1.SharingMPS:
			mpsLimits = append(mpsLimits, fmt.Sprintf("%d=%dM", ordinal, mib))
		case apiv1alpha1.SharingHAMiCore:
			edits.Env = append(edits.Env,
				"CUDA_DEVICE_MEMORY_LIMIT_"+ord+"="+strconv.FormatInt(mib, 10)+"m",
				"CUDA_DEVICE_SM_LIMIT_"+ord+"="+strconv.FormatInt(g.share.Cores, 10),
			)
		case apiv1alpha1.SharingNone:
			// Recorded in GPULINK_SHARE_* only: nothing enforces it.
		default:
			return fmt.Errorf("GPU %d: unknown sharing strategy %q", g.index, g.share.Strategy)
		}
	}
	if len(mpsLimits) == 0 {
		return nil
	}
	// The claim's MPS daemon: its pipe directory, where the container
	// finds it, and the shm directory its server shares with the
	// container as /dev/shm. Isolated: the claim's own daemon (see doc.go,
	// "MPS daemons"), serving all its MPS GPUs; the limits are set on the
	// daemon and the env below only repeats them (a client may lower
	// them, not raise them). Concurrent: the daemon of the claim's
	// namespace on its one GPU (checkClaimShape), which serves the
	// namespace's other claims there too and has no limits of its own;
	// the env below is what limits this claim's clients (MPS reads it per
	// client), and CUDA_MPS_CLIENT_PRIORITY (priority.go) orders them
	// against the other claims' clients of that server. Either way the
	// cores are one percentage for all GPUs (checkClaimShape).
	share := c.mpsShare()
	dirs := o.MPSDirs(share)
	edits.Env = append(edits.Env,
		"CUDA_MPS_PIPE_DIRECTORY="+dirs.Pipe,
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+strings.Join(mpsLimits, ","),
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.FormatInt(share.Cores, 10),
	)
	edits.Mounts = append(edits.Mounts,
		&cdispec.Mount{
			HostPath:      dirs.Pipe,
			ContainerPath: dirs.Pipe,
			Type:          "bind",
			Options:       []string{"rbind", "rw", "nosuid", "nodev", "noexec"},
		},
		&cdispec.Mount{
			HostPath:      dirs.Shm,
			ContainerPath: "/dev/shm",
			Type:          "bind",
			Options:       []string{"rbind", "rw", "nosuid", "nodev", "noexec"},
		},
	)
	return nil
}

// charDevice describes the character device at host for the CDI spec,
// with its type and numbers filled in so that the container runtime does
// not need to look at the host path again.
// seen is where this process sees the node.
func charDevice(stat func(string) (os.FileInfo, error), path, seen, host string) (*cdispec.DeviceNode, error) {
	fi, err := stat(seen)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || fi.Mode()&os.ModeCharDevice == 0 || fi.Mode()&os.ModeDevice == 0 {
		return nil, fmt.Errorf("%s is not a character device", seen)
	}
	n := &cdispec.DeviceNode{
		Path:  path,
		Type:  "c",
		Major: int64(unix.Major(uint64(st.Rdev))), //nolint:unconvert // Rdev's type differs per platform
		Minor: int64(unix.Minor(uint64(st.Rdev))), //nolint:unconvert // Rdev's type differs per platform
	}
	if host != path {
		n.HostPath = host
	}
	return n, nil
}

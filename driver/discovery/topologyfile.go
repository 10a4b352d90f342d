package discovery

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/google/uuid"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// TopologyFileOptions configure the topology-file backend. A topology file
// says how GPUs are wired but not what they are, so the options describe
// the (identical) GPUs of the simulated node.
type TopologyFileOptions struct {
	// Path is an `nvidia-smi topo -m` output file. Required.
	Path string
	// NodeName seeds the synthetic GPU UUIDs so that every node of a
	// simulated cluster gets distinct, stable ones. Required; a DNS
	// subdomain as Kubernetes node names are.
	NodeName string
	// ProductName, e.g. "NVIDIA A100-SXM4-40GB". Required, at most 64
	// characters (the DRA limit for string attributes).
	ProductName string
	// Architecture, lower-case as NVML-backed discovery reports it
	// (e.g. "ampere"). Optional: derived from CUDAComputeCapability when
	// empty, left unknown when that is empty too.
	Architecture string
	// CUDAComputeCapability "major.minor", e.g. "8.0". Optional.
	CUDAComputeCapability string
	// DriverVersion "<major>.<minor>[.<patch>]", e.g. "550.54.15". Optional.
	DriverVersion string
	// MemoryBytes is each GPU's memory. Required, positive.
	MemoryBytes int64
}

// topologyFileDiscoverer serves a topology file as if NVML had found it.
type topologyFileDiscoverer struct {
	opts TopologyFileOptions
	arch string
}

var (
	// nodeNamePattern is a DNS-1123 subdomain, what Kubernetes requires
	// of node names.
	nodeNamePattern      = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	computeCapPattern    = regexp.MustCompile(`^([0-9]{1,2})\.([0-9]{1,2})$`)
	driverVersionPattern = regexp.MustCompile(`^[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$`)
)

// maxStringAttr is the DRA limit on string attribute values.
const maxStringAttr = 64

// NewTopologyFile returns a Discoverer that reads the topology file at
// opts.Path on every Discover, so edits show up without a restart.
//
// What the file cannot tell is filled in: Minor equals Index; UUIDs are
// "GPU-" plus a name-based (SHA-1, version 5) UUID of
// "gpulink/<node>/<index>", stable across restarts and distinct across
// nodes; PCI bus IDs are synthetic ("0000:<index+1>:00.0", bus 0 being
// the host bridge's) and only unique within the node; the PCIe root stays
// unknown. NUMA node and CPU affinity come from the file's affinity
// columns when it has them.
func NewTopologyFile(opts TopologyFileOptions) (Discoverer, error) {
	if opts.Path == "" {
		return nil, fmt.Errorf("topology file option Path is empty: want an nvidia-smi topo -m output file")
	}
	st, err := os.Stat(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("topology file option Path %q: %w", opts.Path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("topology file option Path %q: is a %s, want a regular file", opts.Path, st.Mode().Type())
	}
	if len(opts.NodeName) > 253 || !nodeNamePattern.MatchString(opts.NodeName) {
		return nil, fmt.Errorf("topology file option NodeName %q: want a Kubernetes node name (DNS-1123 subdomain)", opts.NodeName)
	}
	if err := validProductName(opts.ProductName); err != nil {
		return nil, err
	}
	if opts.MemoryBytes <= 0 {
		return nil, fmt.Errorf("topology file option MemoryBytes %d: want a positive number of bytes", opts.MemoryBytes)
	}
	if opts.DriverVersion != "" && !driverVersionPattern.MatchString(opts.DriverVersion) {
		return nil, fmt.Errorf("topology file option DriverVersion %q: want <major>.<minor>[.<patch>], e.g. 550.54.15", opts.DriverVersion)
	}
	arch, err := fileArchitecture(opts.Architecture, opts.CUDAComputeCapability)
	if err != nil {
		return nil, err
	}
	return &topologyFileDiscoverer{opts: opts, arch: arch}, nil
}

func validProductName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return fmt.Errorf("topology file option ProductName %q: want the GPU's product name, e.g. NVIDIA A100-SXM4-40GB", name)
	case len(name) > maxStringAttr:
		return fmt.Errorf("topology file option ProductName %q: %d bytes, at most %d fit a device attribute", name, len(name), maxStringAttr)
	case strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("topology file option ProductName %q: contains non-printable characters", name)
	}
	return nil
}

// fileArchitecture validates the architecture and compute capability
// options against each other and returns the architecture to report.
func fileArchitecture(arch, cc string) (string, error) {
	derived := ""
	if cc != "" {
		m := computeCapPattern.FindStringSubmatch(cc)
		if m == nil {
			return "", fmt.Errorf("topology file option CUDAComputeCapability %q: want <major>.<minor>, e.g. 8.0", cc)
		}
		major, _ := strconv.Atoi(m[1])
		minor, _ := strconv.Atoi(m[2])
		derived = archFromComputeCapability(major, minor)
	}
	if arch == "" {
		return derived, nil
	}
	if !knownArchitecture(arch) {
		return "", fmt.Errorf("topology file option Architecture %q: want one of %s", arch, strings.Join(architectureNames(), ", "))
	}
	if derived != "" && derived != arch {
		return "", fmt.Errorf("topology file option Architecture %q contradicts CUDAComputeCapability %q, which is %s", arch, cc, derived)
	}
	return arch, nil
}

// uuidNamespace scopes gpulink's synthetic GPU UUIDs under the driver name.
var uuidNamespace = uuid.NewSHA1(uuid.NameSpaceDNS, []byte(driver.Name))

// syntheticUUID is the UUID a GPU of a topology file gets.
func syntheticUUID(node string, index int) string {
	return "GPU-" + uuid.NewSHA1(uuidNamespace, []byte("gpulink/"+node+"/"+strconv.Itoa(index))).String()
}

// syntheticBusID is the PCI bus ID a GPU of a topology file gets.
func syntheticBusID(index int) string {
	return pciAddress{bus: uint32(index) + 1}.String()
}

// Discover parses the file and dresses its GPUs with the options.
func (d *topologyFileDiscoverer) Discover(ctx context.Context) (*topology.Topology, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discover GPUs from topology file %s: %w", d.opts.Path, err)
	}
	t, err := topology.ParseFile(d.opts.Path)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs from topology file: %w", err)
	}
	// The parsed topology is this call's own, and what it derives from the
	// links (islands, groups) does not depend on these fields, so they are
	// filled in place rather than copied into a second topology.New.
	for p := range t.GPUs {
		g := &t.GPUs[p]
		if g.Index > 0xfe {
			return nil, fmt.Errorf("topology file %s: GPU index %d does not fit a synthetic PCI bus number", d.opts.Path, g.Index)
		}
		g.Minor = g.Index
		g.UUID = syntheticUUID(d.opts.NodeName, g.Index)
		g.ProductName = d.opts.ProductName
		g.Architecture = d.arch
		g.CUDAComputeCapability = d.opts.CUDAComputeCapability
		g.DriverVersion = d.opts.DriverVersion
		g.MemoryBytes = d.opts.MemoryBytes
		g.PCIBusID = syntheticBusID(g.Index)
	}
	return t, nil
}

package compat

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver"
)

// Config says which device-plugin resource names are translated and what
// they mean. Each family can be turned off and its names changed, so an
// operator who still runs a device plugin for one family leaves it alone.
type Config struct {
	// WholeClass is the DeviceClass of whole GPUs, ShareClass the one of
	// shares, MIGClass the one of MIG devices.
	WholeClass string `json:"wholeClass,omitempty"`
	ShareClass string `json:"shareClass,omitempty"`
	MIGClass   string `json:"migClass,omitempty"`
	// NVIDIA: the NVIDIA device plugin's nvidia.com/gpu and HAMi's
	// memory/core names and pod annotations.
	NVIDIA NVIDIAFamily `json:"nvidia"`
	// Aliyun: the gputopology scheduler extender's aliyun.com/gpu.
	Aliyun AliyunFamily `json:"aliyun"`
	// Tencent: TKEStack gpu-manager's vcuda-core / vcuda-memory.
	Tencent TencentFamily `json:"tencent"`
}

// NVIDIAFamily are the names the NVIDIA device plugin and HAMi use.
type NVIDIAFamily struct {
	Enabled bool `json:"enabled"`
	// GPU counts GPUs (nvidia.com/gpu).
	GPU string `json:"gpu,omitempty"`
	// Memory is a share's memory per GPU in MemoryUnit (nvidia.com/gpumem, MiB).
	Memory string `json:"memory,omitempty"`
	// MemoryPercentage is a share's memory in percent of the GPU's
	// (nvidia.com/gpumem-percentage).
	MemoryPercentage string `json:"memoryPercentage,omitempty"`
	// Cores is a share's percentage of the GPU's SMs (nvidia.com/gpucores).
	Cores string `json:"cores,omitempty"`
	// Priority is HAMi's task priority (nvidia.com/priority): 0 high, 1
	// low. It asks for no device: it becomes the claim's
	// sharing.priority and never stays on the pod.
	Priority string `json:"priority,omitempty"`
	// MemoryUnit is the size of one unit of Memory (1Mi).
	MemoryUnit *resource.Quantity `json:"memoryUnit,omitempty"`
	// Annotations turns HAMi's pod annotations on (use-gputype,
	// use-gpuuuid, scheduler policies); off, they are not looked at.
	Annotations bool `json:"annotations"`
	// MIG turns on the NVIDIA device plugin's mixed-strategy MIG
	// resources, MIGPrefix followed by a profile name
	// (nvidia.com/mig-1g.10gb: N): N MIG devices of that profile from
	// MIGClass.
	MIG       bool   `json:"mig"`
	MIGPrefix string `json:"migPrefix,omitempty"`
}

// AliyunFamily is the gputopology extender's name.
type AliyunFamily struct {
	Enabled bool   `json:"enabled"`
	GPU     string `json:"gpu,omitempty"`
}

// TencentFamily are TKEStack gpu-manager's names: Cores in percent of one
// GPU (multiples of 100 are whole GPUs), Memory in MemoryUnit (256Mi).
type TencentFamily struct {
	Enabled    bool               `json:"enabled"`
	Cores      string             `json:"cores,omitempty"`
	Memory     string             `json:"memory,omitempty"`
	MemoryUnit *resource.Quantity `json:"memoryUnit,omitempty"`
}

// DefaultConfig is what the chart ships: the nvidia.com/* family on,
// with HAMi's annotations and MIG resources; the others off.
func DefaultConfig() Config {
	c := Config{
		NVIDIA:  NVIDIAFamily{Enabled: true, Annotations: true, MIG: true},
		Aliyun:  AliyunFamily{},
		Tencent: TencentFamily{},
	}
	c.Default()
	return c
}

// Default fills every empty name with the upstream projects' names, so a
// configuration only spells out what it changes.
func (c *Config) Default() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.WholeClass, driver.DeviceClassWhole)
	def(&c.ShareClass, driver.DeviceClassShare)
	def(&c.MIGClass, driver.DeviceClassMIG)
	def(&c.NVIDIA.MIGPrefix, "nvidia.com/mig-")
	def(&c.NVIDIA.GPU, "nvidia.com/gpu")
	def(&c.NVIDIA.Memory, "nvidia.com/gpumem")
	def(&c.NVIDIA.MemoryPercentage, "nvidia.com/gpumem-percentage")
	def(&c.NVIDIA.Cores, "nvidia.com/gpucores")
	def(&c.NVIDIA.Priority, "nvidia.com/priority")
	if c.NVIDIA.MemoryUnit == nil {
		q := resource.MustParse("1Mi")
		c.NVIDIA.MemoryUnit = &q
	}
	def(&c.Aliyun.GPU, "aliyun.com/gpu")
	def(&c.Tencent.Cores, "tencent.com/vcuda-core")
	def(&c.Tencent.Memory, "tencent.com/vcuda-memory")
	if c.Tencent.MemoryUnit == nil {
		q := resource.MustParse("256Mi")
		c.Tencent.MemoryUnit = &q
	}
}

// Validate checks names and units: every enabled name is a valid extended
// resource name, no name is used twice, units are positive.
func (c *Config) Validate() error {
	var errs []error
	for _, cl := range []struct{ field, v string }{{"wholeClass", c.WholeClass}, {"shareClass", c.ShareClass}, {"migClass", c.MIGClass}} {
		for _, m := range validation.IsDNS1123Subdomain(cl.v) {
			errs = append(errs, fmt.Errorf("%s %q: %s", cl.field, cl.v, m))
		}
	}
	seen := map[string]string{}
	name := func(field, v string) {
		if msgs := extendedResourceNameErrors(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s %q is not an extended resource name: %s", field, v, msgs))
			return
		}
		if other, dup := seen[v]; dup {
			errs = append(errs, fmt.Errorf("%s %q is also %s", field, v, other))
		}
		seen[v] = field
	}
	unit := func(field string, q *resource.Quantity) {
		if q == nil || q.Sign() <= 0 {
			errs = append(errs, fmt.Errorf("%s %v must be a positive quantity", field, q))
		}
	}
	if c.NVIDIA.Enabled {
		name("nvidia.gpu", c.NVIDIA.GPU)
		name("nvidia.memory", c.NVIDIA.Memory)
		name("nvidia.memoryPercentage", c.NVIDIA.MemoryPercentage)
		name("nvidia.cores", c.NVIDIA.Cores)
		name("nvidia.priority", c.NVIDIA.Priority)
		unit("nvidia.memoryUnit", c.NVIDIA.MemoryUnit)
	}
	if c.NVIDIA.Enabled && c.NVIDIA.MIG {
		// The prefix names a resource once a profile follows it.
		p := c.NVIDIA.MIGPrefix
		if msgs := extendedResourceNameErrors(p + "1g.10gb"); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("nvidia.migPrefix %q followed by a profile (%q) is not an extended resource name: %s", p, p+"1g.10gb", msgs))
		}
	}
	if c.Aliyun.Enabled {
		name("aliyun.gpu", c.Aliyun.GPU)
	}
	if c.Tencent.Enabled {
		name("tencent.cores", c.Tencent.Cores)
		name("tencent.memory", c.Tencent.Memory)
		unit("tencent.memoryUnit", c.Tencent.MemoryUnit)
	}
	if c.NVIDIA.Enabled && c.NVIDIA.MIG {
		for _, v := range slices.Sorted(maps.Keys(seen)) {
			if field := seen[v]; strings.HasPrefix(v, c.NVIDIA.MIGPrefix) {
				errs = append(errs, fmt.Errorf("%s %q starts with nvidia.migPrefix %q, so it would be read as a MIG profile", field, v, c.NVIDIA.MIGPrefix))
			}
		}
	}
	return errors.Join(errs...)
}

// extendedResourceNameErrors follows the API server's rule for extended
// resources: a qualified name with a domain outside kubernetes.io, not
// starting with requests.
func extendedResourceNameErrors(v string) []string {
	msgs := validation.IsQualifiedName(v)
	if len(msgs) > 0 {
		return msgs
	}
	domain, _, ok := bytes.Cut([]byte(v), []byte("/"))
	if !ok {
		return []string{"needs a domain prefix (example.com/name)"}
	}
	d := string(domain)
	if d == "kubernetes.io" || bytes.HasSuffix(domain, []byte(".kubernetes.io")) || bytes.HasPrefix([]byte(v), []byte("requests.")) {
		return []string{"the kubernetes.io domain and the requests. prefix are reserved"}
	}
	return nil
}

// Decode reads a configuration strictly (unknown or duplicate fields are
// errors), fills defaults and validates it.
func Decode(data []byte) (Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("compat config: %w", err)
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("compat config: %w", err)
	}
	return c, nil
}

// Load decodes the configuration file at path; an empty path means
// DefaultConfig.
func Load(path string) (Config, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading compat config: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

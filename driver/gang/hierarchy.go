package gang

import (
	"errors"
	"fmt"
	"strings"
)

// Default node-label keys of the hierarchy, tightest first: the
// multi-node NVLink domain of GB200/GB300 NVL72 racks (set by GPU Feature
// Discovery), NVIDIA Topograph's accelerator, leaf and spine switches, and
// the zone.
const (
	LabelClique      = "nvidia.com/gpu.clique"
	LabelAccelerator = "network.topology.nvidia.com/accelerator"
	LabelLeaf        = "network.topology.nvidia.com/leaf"
	LabelSpine       = "network.topology.nvidia.com/spine"
	LabelZone        = "topology.kubernetes.io/zone"
	// LabelHostname names level 0 (one node) in LevelOfKey, as a PodGroup
	// topology key may.
	LabelHostname = "kubernetes.io/hostname"
)

// DefaultKeys are the default hierarchy keys, tightest first.
var DefaultKeys = []string{LabelClique, LabelAccelerator, LabelLeaf, LabelSpine, LabelZone}

// ErrInvalid marks an invalid hierarchy, request or node: it will never
// succeed, unlike an *UnplaceableError, which may succeed later.
var ErrInvalid = errors.New("invalid gang input")

// Level is one level of the hierarchy above a single node.
type Level struct {
	// Key is the node label whose value names the node's domain at this
	// level; nodes with the same non-empty value share the domain.
	Key string
	// Name is the level's name in messages ("leaf"); empty: derived from
	// the key (the part after the last '/' and then after the last '.').
	Name string
	// Plural is Name's plural in messages ("leaves"); empty: derived.
	Plural string
}

// Hierarchy is the cluster's levels, tightest first. Level 0 is one node,
// levels 1..len(keys) are the label keys in order, and the last level,
// Cluster(), is every node. A node without a level's label is in no
// shared domain at that level. Domains are expected to nest (a clique
// inside one leaf); where labels do not nest, a gang's level is still the
// lowest level whose label all its nodes share.
type Hierarchy struct {
	levels []Level
}

// NewHierarchy checks and completes levels (tightest first): keys must be
// non-empty and distinct.
func NewHierarchy(levels []Level) (*Hierarchy, error) {
	seen := map[string]bool{}
	out := make([]Level, len(levels))
	for i, l := range levels {
		if strings.TrimSpace(l.Key) == "" {
			return nil, fmt.Errorf("%w: hierarchy level %d: key is empty", ErrInvalid, i+1)
		}
		if seen[l.Key] {
			return nil, fmt.Errorf("%w: hierarchy level %d: key %q appears twice", ErrInvalid, i+1, l.Key)
		}
		if l.Key == LabelHostname {
			return nil, fmt.Errorf("%w: hierarchy level %d: key %q is level 0 (one node) already", ErrInvalid, i+1, l.Key)
		}
		seen[l.Key] = true
		if l.Name == "" {
			l.Name = nameOfKey(l.Key)
		}
		if l.Plural == "" {
			l.Plural = plural(l.Name)
		}
		out[i] = l
	}
	return &Hierarchy{levels: out}, nil
}

// NewHierarchyFromKeys is NewHierarchy with names derived from the keys.
func NewHierarchyFromKeys(keys []string) (*Hierarchy, error) {
	levels := make([]Level, len(keys))
	for i, k := range keys {
		levels[i] = Level{Key: k}
	}
	return NewHierarchy(levels)
}

// DefaultHierarchy is the hierarchy of DefaultKeys: clique, accelerator,
// leaf, spine, zone.
func DefaultHierarchy() *Hierarchy {
	h, err := NewHierarchyFromKeys(DefaultKeys)
	if err != nil {
		panic(err) // DefaultKeys are valid; a test checks it
	}
	return h
}

// Cluster is the index of the top level, every node.
func (h *Hierarchy) Cluster() int { return len(h.levels) + 1 }

// Keys are the label keys, tightest first (levels 1..Cluster()-1).
func (h *Hierarchy) Keys() []string {
	keys := make([]string, len(h.levels))
	for i, l := range h.levels {
		keys[i] = l.Key
	}
	return keys
}

// Key is the label key of level; "" for level 0 and the cluster.
func (h *Hierarchy) Key(level int) string {
	if level < 1 || level > len(h.levels) {
		return ""
	}
	return h.levels[level-1].Key
}

// Name is level's name in messages: "node", a level's Name, "cluster".
func (h *Hierarchy) Name(level int) string {
	switch {
	case level <= 0:
		return "node"
	case level > len(h.levels):
		return "cluster"
	}
	return h.levels[level-1].Name
}

// Plural is Name's plural.
func (h *Hierarchy) Plural(level int) string {
	switch {
	case level <= 0:
		return "nodes"
	case level > len(h.levels):
		return "clusters"
	}
	return h.levels[level-1].Plural
}

// LevelOfKey is the level a node-label key names (a PodGroup's
// schedulingConstraints.topology key): kubernetes.io/hostname is level 0,
// a hierarchy key its level; false for any other key.
func (h *Hierarchy) LevelOfKey(key string) (int, bool) {
	if key == LabelHostname {
		return 0, true
	}
	for i, l := range h.levels {
		if l.Key == key {
			return i + 1, true
		}
	}
	return 0, false
}

// LevelOfName is the level named name ("leaf", "node", "cluster"), for
// configuration that names levels rather than keys.
func (h *Hierarchy) LevelOfName(name string) (int, bool) {
	for lv := 0; lv <= h.Cluster(); lv++ {
		if h.Name(lv) == name {
			return lv, true
		}
	}
	return 0, false
}

// Domains returns a node's domain per level 1..Cluster()-1 (index i is
// level i+1) from its labels, as Node.Domains wants them; "" where the
// node lacks the label.
func (h *Hierarchy) Domains(labels map[string]string) []string {
	d := make([]string, len(h.levels))
	for i, l := range h.levels {
		d[i] = labels[l.Key]
	}
	return d
}

func nameOfKey(key string) string {
	n := key[strings.LastIndex(key, "/")+1:]
	if i := strings.LastIndex(n, "."); i >= 0 && i < len(n)-1 {
		n = n[i+1:]
	}
	return n
}

func plural(name string) string {
	switch {
	case strings.HasSuffix(name, "f"):
		return strings.TrimSuffix(name, "f") + "ves"
	case strings.HasSuffix(name, "s"), strings.HasSuffix(name, "x"), strings.HasSuffix(name, "ch"), strings.HasSuffix(name, "sh"):
		return name + "es"
	}
	return name + "s"
}

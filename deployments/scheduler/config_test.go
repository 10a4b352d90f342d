// Package scheduler holds kube-scheduler configurations shipped with
// gpulink (docs/cpu-pods.md); this test reads them as kube-scheduler's
// v1 configuration API spells them.
package scheduler

import (
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// The fields of kubescheduler.config.k8s.io/v1 the profile sets.
type schedulerConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Profiles   []struct {
		SchedulerName string `json:"schedulerName"`
		PluginConfig  []struct {
			Name string `json:"name"`
			Args struct {
				ScoringStrategy *struct {
					Type      string `json:"type"`
					Resources []struct {
						Name   string `json:"name"`
						Weight int    `json:"weight"`
					} `json:"resources"`
				} `json:"scoringStrategy"`
			} `json:"args"`
		} `json:"pluginConfig"`
	} `json:"profiles"`
}

// gpulink-mostalloc.yaml keeps the default profile as it is and adds
// gpulink-mostalloc, whose NodeResourcesFit scores MostAllocated on CPU
// and memory with equal weights: what the replay's gpulink+mostalloc row
// models (internal/tracebench, kubeScore).
func TestMostAllocProfile(t *testing.T) {
	raw, err := os.ReadFile("gpulink-mostalloc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c schedulerConfig
	if err := yaml.UnmarshalStrict(raw, &c, yaml.DisallowUnknownFields); err != nil {
		t.Fatalf("gpulink-mostalloc.yaml: %v", err)
	}
	if c.APIVersion != "kubescheduler.config.k8s.io/v1" || c.Kind != "KubeSchedulerConfiguration" {
		t.Fatalf("apiVersion %q kind %q", c.APIVersion, c.Kind)
	}
	if len(c.Profiles) != 2 || c.Profiles[0].SchedulerName != "default-scheduler" || len(c.Profiles[0].PluginConfig) != 0 {
		t.Fatalf("want the default profile unchanged first, got %+v", c.Profiles)
	}
	p := c.Profiles[1]
	if p.SchedulerName != "gpulink-mostalloc" || len(p.PluginConfig) != 1 || p.PluginConfig[0].Name != "NodeResourcesFit" {
		t.Fatalf("second profile %+v, want gpulink-mostalloc configuring NodeResourcesFit", p)
	}
	s := p.PluginConfig[0].Args.ScoringStrategy
	if s == nil || s.Type != "MostAllocated" || len(s.Resources) != 2 {
		t.Fatalf("scoring strategy %+v, want MostAllocated on two resources", s)
	}
	for i, want := range []string{"cpu", "memory"} {
		if s.Resources[i].Name != want || s.Resources[i].Weight != 1 {
			t.Errorf("resource %d: %+v, want %s with weight 1", i, s.Resources[i], want)
		}
	}
}

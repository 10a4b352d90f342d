//go:build e2e

package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/internal/memlimit"
	"github.com/gpulink/gpulink/test/localcluster"
)

// checkMemoryLimit checks that each controller replica the chart runs
// read its container's memory limit through the downward API and set the
// Go runtime's soft limit to memlimit.Percent of it, as it logs at
// start-up.
func checkMemoryLimit(t *testing.T, cluster *localcluster.Cluster, limitBytes int64, pods ...*corev1.Pod) {
	t.Helper()
	want := fmt.Sprintf("containerLimitBytes=%d softLimitBytes=%d", limitBytes, limitBytes/100*memlimit.Percent)
	for _, p := range pods {
		log, err := localcluster.ReadPodLogFile(cluster.PodLogDir(), p, "controller")
		if err != nil {
			t.Fatalf("controller pod %s: %v", p.Name, err)
		}
		line := ""
		for l := range strings.Lines(log) {
			if strings.Contains(l, `"Go memory limit"`) {
				line = l
				break
			}
		}
		if !strings.Contains(line, want) {
			t.Errorf("controller pod %s: its log's memory limit line is %q; want one with %s (the chart's 1536Mi limit)", p.Name, strings.TrimSpace(line), want)
		}
	}
}

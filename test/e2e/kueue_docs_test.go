//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpulink/gpulink/test/localcluster"
)

// kueueDocsKinds are the kinds of docs/kueue.md's examples that the API
// server (with Kueue's CRDs and webhooks) can check; the others (Kueue's
// Configuration, the chart's values) are files, not objects.
var kueueDocsKinds = map[string]schema.GroupVersionResource{
	"ResourceFlavor":        resourceFlavorGVR,
	"ClusterQueue":          clusterQueueGVR,
	"LocalQueue":            localQueueGVR,
	"ResourceClaimTemplate": {Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"},
	"Job":                   {Group: "batch", Version: "v1", Resource: "jobs"},
}

// docsExamplesAccepted creates every object of docs/kueue.md's YAML
// examples as a server-side dry run, through the API server's validation
// and Kueue's and gpulink's webhooks. An object of the same name the test
// created already (team-a's queue, the flavor) comes back AlreadyExists,
// which the API server answers after validating it.
func (s *kueueSuite) docsExamplesAccepted(ctx context.Context, t *testing.T) {
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "kueue.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]int{}
	for _, block := range yamlBlocks(string(doc)) {
		objs, err := localcluster.DecodeObjects([]byte(block))
		if err != nil {
			t.Errorf("docs/kueue.md: a YAML example does not decode: %v\n%s", err, block)
			continue
		}
		for _, o := range objs {
			gvr, ok := kueueDocsKinds[o.GetKind()]
			if !ok {
				continue
			}
			var res dynamic.ResourceInterface = s.dyn.Resource(gvr)
			if o.GetNamespace() != "" {
				res = s.dyn.Resource(gvr).Namespace(o.GetNamespace())
			}
			_, err := res.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("docs/kueue.md: %s %s refused: %v", o.GetKind(), name(o), err)
				continue
			}
			checked[o.GetKind()]++
		}
	}
	for kind := range kueueDocsKinds {
		if checked[kind] == 0 {
			t.Errorf("docs/kueue.md has no %s example accepted", kind)
		}
	}
	t.Logf("docs/kueue.md's examples accepted by the API server, Kueue's and gpulink's webhooks: %v", checked)
}

func name(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// yamlBlocks returns the contents of the ```yaml fenced blocks of a
// Markdown document.
func yamlBlocks(md string) []string {
	var out []string
	var cur []string
	in := false
	for _, l := range strings.Split(md, "\n") {
		switch {
		case !in && strings.TrimSpace(l) == "```yaml":
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, l)
		}
	}
	return out
}

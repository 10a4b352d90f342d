package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// watchRun runs `gpulink inspect --watch args...` in the background and
// hands over the output after each view.
type watchRun struct {
	t      *testing.T
	views  chan string
	done   chan error
	cancel context.CancelFunc
	// finished is set once the test read the result from done.
	finished bool
}

func startWatch(t *testing.T, cs *fake.Clientset, args ...string) *watchRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchRun{t: t, views: make(chan string), done: make(chan error, 1), cancel: cancel}
	var out, errOut bytes.Buffer
	o := &inspectOptions{output: outputTable, onRender: func(int) {
		// Called on the command's goroutine, between writes.
		view := out.String()
		out.Reset()
		select {
		case w.views <- view:
		case <-ctx.Done():
		}
	}}
	root := NewRootCommand("gpulink")
	for _, c := range root.Commands() {
		if c.Name() == "inspect" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(newInspectCommandOpts("gpulink", func(*inspectOptions) (kubernetes.Interface, string, error) { return cs, fakeServer, nil }, o))
	root.SetArgs(append([]string{"inspect", "--watch"}, args...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	go func() { w.done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if w.finished {
			return
		}
		if err := <-w.done; err != nil {
			t.Errorf("watch ended with %v after cancellation, want nil", err)
		}
	})
	return w
}

// next returns the next view; the deadline only keeps a broken watch from
// hanging the test binary.
func (w *watchRun) next() string {
	w.t.Helper()
	select {
	case v := <-w.views:
		return v
	case err := <-w.done:
		w.finished = true
		w.t.Fatalf("watch ended early: %v", err)
	case <-time.After(time.Minute):
		w.t.Fatal("no view within a minute")
	}
	return ""
}

func TestInspectWatchShowsChanges(t *testing.T) {
	cs := fake.NewClientset(publishedSlice(t, "node-b", "pcie-4.txt", "Tesla P40", 24<<30))
	w := startWatch(t, cs, "--watch-interval=0")
	first := w.next()
	for _, want := range []string{"Watching " + fakeServer, "initial view", "NODE node-b: 4 GPUs, 4 free, 0 shared, 0 held whole"} {
		if !strings.Contains(first, want) {
			t.Errorf("first view lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(first, clearScreen) {
		t.Error("the view clears the screen although the output is not a terminal")
	}
	claim := heldClaim("team-c", "render", []string{"render-0"}, wholeGPU("node-b", "gpu-2"))
	if _, err := cs.ResourceV1().ResourceClaims("team-c").Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := w.next()
	for _, want := range []string{"view 2", "NODE node-b: 4 GPUs, 3 free, 0 shared, 1 held whole", "team-c/render"} {
		if !strings.Contains(second, want) {
			t.Errorf("view after the claim was allocated lacks %q:\n%s", want, second)
		}
	}
	if err := cs.ResourceV1().ResourceClaims("team-c").Delete(context.Background(), "render", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if third := w.next(); !strings.Contains(third, "4 free") || strings.Contains(third, "team-c/render") {
		t.Errorf("view after the claim was deleted still shows it:\n%s", third)
	}
	w.cancel()
	w.finished = true
	if err := <-w.done; err != nil {
		t.Errorf("watch ended with %v after cancellation, want nil", err)
	}
}

func TestInspectWatchJSONLines(t *testing.T) {
	cs := fake.NewClientset(publishedSlice(t, "node-b", "pcie-4.txt", "Tesla P40", 24<<30))
	w := startWatch(t, cs, "--watch-interval=0", "-o", "json")
	first := w.next()
	if strings.Count(first, "\n") != 1 {
		t.Fatalf("a JSON view is not one line:\n%s", first)
	}
	var doc inspectDocument
	if err := json.Unmarshal([]byte(first), &doc); err != nil || len(doc.Nodes) != 1 || doc.Nodes[0].Name != "node-b" {
		t.Fatalf("view %q: %v, %+v", first, err, doc)
	}
}

func TestInspectWatchRejectsNegativeInterval(t *testing.T) {
	newClient, _ := fakeClient()
	_, _, err := runInspectCmd(t, newClient, "--watch", "--watch-interval=-1s")
	if err == nil || !strings.Contains(err.Error(), "--watch-interval must not be negative, got -1s") {
		t.Errorf("err = %v", err)
	}
}

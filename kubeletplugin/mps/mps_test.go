package mps

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeMPSDriverRoot is a driver install with the MPS control binary and
// libcuda where Debian puts them.
func fakeMPSDriverRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"usr/bin/nvidia-cuda-mps-control", "usr/lib/x86_64-linux-gnu/libcuda.so.1"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNewPodMPSDaemonErrors(t *testing.T) {
	good := PodDaemonConfig{
		Pods: fake.NewClientset().CoreV1(), Namespace: "gpulink", Image: "gpulink:dev", NodeName: "n1",
		DriverRoot: "/run/nvidia/driver", DriverRootMount: fakeMPSDriverRoot(t),
	}
	if _, err := NewPodDaemon(good); err != nil {
		t.Fatal(err)
	}
	noLib := fakeMPSDriverRoot(t)
	if err := os.Remove(filepath.Join(noLib, "usr/lib/x86_64-linux-gnu/libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mod  func(*PodDaemonConfig)
		want string
	}{
		"no image":     {func(c *PodDaemonConfig) { c.Image = "" }, "--mps-daemon-image"},
		"no namespace": {func(c *PodDaemonConfig) { c.Namespace = "" }, "--mps-daemon-namespace"},
		"no binary":    {func(c *PodDaemonConfig) { c.DriverRootMount = t.TempDir() }, "no nvidia-cuda-mps-control"},
		"no libcuda":   {func(c *PodDaemonConfig) { c.DriverRootMount = noLib }, "no libcuda.so.1"},
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			tc.mod(&c)
			if _, err := NewPodDaemon(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// fakeControl simulates nvidia-cuda-mps-control clients: the daemon
// answers once its pod runs, and records the commands it got.
type fakeControl struct {
	mu       sync.Mutex
	up       bool
	commands []string
	envs     [][]string
	bins     []string
	failCmd  string
	// servers is what get_server_list prints.
	servers string
}

func (f *fakeControl) run(_ context.Context, name string, _, env []string, stdin string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bins = append(f.bins, name)
	if !f.up {
		return []byte("Cannot find MPS control daemon process"), errors.New("exit status 1")
	}
	cmd := strings.TrimSpace(stdin)
	if f.failCmd != "" && strings.HasPrefix(cmd, f.failCmd) {
		return []byte("Invalid value"), errors.New("exit status 1")
	}
	f.commands = append(f.commands, cmd)
	f.envs = append(f.envs, env)
	if cmd == "get_server_list" {
		return []byte(f.servers), nil
	}
	return nil, nil
}

// kubelet plays the node: pods of the daemon get the given phase (and
// the control daemon comes up when Running).
func setPodPhase(t *testing.T, cs *fake.Clientset, ns, name string, phase corev1.PodPhase, status corev1.ContainerStatus) {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	p.Status.ContainerStatuses = []corev1.ContainerStatus{status}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func newTestPodDaemon(t *testing.T, cs *fake.Clientset, ctl *fakeControl) (*PodDaemon, string) {
	t.Helper()
	mount := fakeMPSDriverRoot(t)
	d, err := NewPodDaemon(PodDaemonConfig{
		Pods: cs.CoreV1(), Nodes: cs.CoreV1(), Namespace: "gpulink", Image: "gpulink:dev", NodeName: "n1",
		DriverRoot: "/run/nvidia/driver", DriverRootMount: mount, Run: ctl.run,
		PollInterval: time.Millisecond, StartTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, mount
}

func TestPodMPSDaemonStartStopAdopt(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}})
	ctl := &fakeControl{}
	d, mount := newTestPodDaemon(t, cs, ctl)
	// The daemon answers once the goroutine below saw the pod; under load
	// that can take longer than the 200ms the timeout tests use.
	d.cfg.StartTimeout = time.Minute
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: types.UID("11111111-2222-3333-4444-555555555555"), GPUs: []Device{{GPU: GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: 5 * gib}}, Cores: 30}
	dirs := m.Dirs(share)
	name := "gpulink-mps-" + string(share.Claim)

	// The "kubelet" runs the pod as soon as it exists.
	go func() {
		for {
			if _, err := cs.CoreV1().Pods("gpulink").Get(context.Background(), name, metav1.GetOptions{}); err == nil {
				setPodPhase(t, cs, "gpulink", name, corev1.PodRunning, corev1.ContainerStatus{})
				ctl.mu.Lock()
				ctl.up = true
				ctl.mu.Unlock()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := m.EnsureDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if pod.Spec.NodeName != "n1" || c.Image != "gpulink:dev" || !slices.Equal(c.Command, []string{"/driver-root/usr/bin/nvidia-cuda-mps-control", "-f"}) {
		t.Errorf("pod node %q image %q command %v", pod.Spec.NodeName, c.Image, c.Command)
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Kind != "Node" || pod.OwnerReferences[0].UID != "node-uid" {
		t.Errorf("owner %+v, want the Node", pod.OwnerReferences)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, want := range map[string]string{
		"CUDA_VISIBLE_DEVICES":    "GPU-1",
		"CUDA_MPS_PIPE_DIRECTORY": dirs.Pipe,
		"CUDA_MPS_LOG_DIRECTORY":  dirs.Log,
		"LD_LIBRARY_PATH":         "/driver-root/usr/lib/x86_64-linux-gnu",
		"PATH":                    "/driver-root/usr/bin:/usr/bin:/bin",
	} {
		if env[k] != want {
			t.Errorf("daemon env %s=%q, want %q", k, env[k], want)
		}
	}
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == vm.Name {
				mounts[vm.MountPath] = v.HostPath.Path
			}
		}
	}
	for cpath, host := range map[string]string{"/driver-root": "/run/nvidia/driver", dirs.Base: dirs.Base, "/dev/shm": dirs.Shm} {
		if mounts[cpath] != host {
			t.Errorf("daemon pod mounts %s at %s, want %s (all: %v)", mounts[cpath], cpath, host, mounts)
		}
	}
	// The claim's limits are the daemon's defaults, for device 0 (the
	// only one it sees).
	want := []string{"get_server_list", "set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 5120M"}
	if !slices.Equal(ctl.commands, want) {
		t.Errorf("control commands %q, want %q", ctl.commands, want)
	}
	// The plugin runs the client from its own mount of the driver root.
	if bin := ctl.bins[len(ctl.bins)-1]; bin != filepath.Join(mount, "usr/bin/nvidia-cuda-mps-control") {
		t.Errorf("control client %s, want it under %s", bin, mount)
	}
	if e := ctl.envs[len(ctl.envs)-1]; !slices.Contains(e, "LD_LIBRARY_PATH="+filepath.Join(mount, "usr/lib/x86_64-linux-gnu")) || !slices.Contains(e, "CUDA_MPS_PIPE_DIRECTORY="+dirs.Pipe) {
		t.Errorf("control client env %v", e)
	}
	if fi, err := os.Stat(dirs.Shm); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("shm dir %v, %v; want sticky and world-writable", fi, err)
	}

	// A restarted plugin adopts the pod and sets the limits again.
	d2, _ := newTestPodDaemon(t, cs, ctl)
	ctl.commands = nil
	m2 := NewManager(filepath.Dir(dirs.Base), d2)
	if err := m2.EnsureDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ctl.commands, want) {
		t.Errorf("after adoption commands %q, want %q", ctl.commands, want)
	}
	if err := m2.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), name, metav1.GetOptions{}); err == nil {
		t.Error("daemon pod not deleted")
	}
	if _, err := os.Stat(dirs.Base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS dirs left behind: %v", err)
	}
	// Stopping again (retried unprepare) is fine.
	if err := d2.Stop(t.Context(), share, dirs); err != nil {
		t.Error(err)
	}
}

func TestPodMPSDaemonStartFailures(t *testing.T) {
	share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
	name := "gpulink-mps-c1"
	for tn, tc := range map[string]struct {
		// node plays the kubelet once the pod exists.
		node func(t *testing.T, cs *fake.Clientset, ctl *fakeControl, logDir string)
		want []string
	}{
		"pod fails": {
			node: func(t *testing.T, cs *fake.Clientset, _ *fakeControl, logDir string) {
				if err := os.WriteFile(filepath.Join(logDir, "control.log"), []byte("[2026] Failed to start: no CUDA-capable device"), 0o644); err != nil {
					t.Error(err)
				}
				setPodPhase(t, cs, "gpulink", name, corev1.PodFailed, corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}})
			},
			want: []string{"ended (Failed)", "exit code 1", "no CUDA-capable device"},
		},
		"never answers": {
			node: func(t *testing.T, cs *fake.Clientset, _ *fakeControl, _ string) {
				setPodPhase(t, cs, "gpulink", name, corev1.PodPending, corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}})
			},
			want: []string{"did not answer", "ImagePullBackOff"},
		},
		"limit refused": {
			node: func(t *testing.T, cs *fake.Clientset, ctl *fakeControl, _ string) {
				ctl.mu.Lock()
				ctl.up, ctl.failCmd = true, "set_default_device_pinned_mem_limit"
				ctl.mu.Unlock()
				setPodPhase(t, cs, "gpulink", name, corev1.PodRunning, corev1.ContainerStatus{})
			},
			want: []string{"setting the claim's limit", "Invalid value"},
		},
	} {
		t.Run(tn, func(t *testing.T) {
			cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			ctl := &fakeControl{}
			d, _ := newTestPodDaemon(t, cs, ctl)
			m := NewManager(t.TempDir(), d)
			dirs := m.Dirs(share)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					if _, err := cs.CoreV1().Pods("gpulink").Get(context.Background(), name, metav1.GetOptions{}); err == nil {
						tc.node(t, cs, ctl, dirs.Log)
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			err := m.EnsureDaemon(t.Context(), share)
			<-done
			if err == nil {
				t.Fatal("start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			// Nothing left behind: no pod, no directories, no reference.
			if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), name, metav1.GetOptions{}); err == nil {
				t.Error("daemon pod left behind")
			}
			if _, err := os.Stat(dirs.Base); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("MPS dirs left behind: %v", err)
			}
			if err := m.ReleaseDaemon(t.Context(), share); err == nil {
				t.Error("failed start left a reference")
			}
		})
	}
}

// A pod of an earlier prepare that is still being deleted is not adopted.
func TestPodMPSDaemonTerminatingPod(t *testing.T) {
	now := metav1.Now()
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpulink-mps-c1", Namespace: "gpulink", DeletionTimestamp: &now, Finalizers: []string{"x"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
	cs := fake.NewClientset(old, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d, _ := newTestPodDaemon(t, cs, &fakeControl{up: true})
	m := NewManager(t.TempDir(), d)
	err := m.EnsureDaemon(t.Context(), Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10})
	if err == nil || !strings.Contains(err.Error(), "still terminating") {
		t.Fatalf("error %v", err)
	}
}

func TestDirOnlyMPSDaemon(t *testing.T) {
	root := t.TempDir()
	m := NewManager(root, DirOnlyDaemon{})
	s := Share{Claim: "c2", GPUs: []Device{{GPU: GPU{Index: 2}, MemoryBytes: gib}}, Cores: 5}
	if err := m.EnsureDaemon(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{m.Dirs(s).Pipe, m.Dirs(s).Log, m.Dirs(s).Shm} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("%s not created: %v", dir, err)
		}
	}
	if m.Dirs(s).Pipe != filepath.Join(root, "c2", "pipe") {
		t.Errorf("pipe dir %s", m.Dirs(s).Pipe)
	}
	if err := m.ReleaseDaemon(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "c2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dirs not removed: %v", err)
	}
}

func TestUnavailableMPSDaemon(t *testing.T) {
	m := NewManager(t.TempDir(), UnavailableDaemon{Err: errors.New("no nvidia-cuda-mps-control")})
	err := m.EnsureDaemon(t.Context(), Share{Claim: "c", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 5})
	if err == nil || !strings.Contains(err.Error(), "MPS sharing is unavailable") || !strings.Contains(err.Error(), "no nvidia-cuda-mps-control") {
		t.Fatalf("error %v", err)
	}
}

// A daemon pod that exists before Start (plugin restart) and then does not
// answer is kept, with its reference: it may serve running containers,
// and the claim's unprepare stops it.
func TestPodMPSDaemonAdoptionFailureKeepsDaemon(t *testing.T) {
	running := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpulink-mps-c1", Namespace: "gpulink"},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	cs := fake.NewClientset(running, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d, _ := newTestPodDaemon(t, cs, &fakeControl{}) // never answers
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
	err := m.EnsureDaemon(t.Context(), share)
	if err == nil || !errors.Is(err, ErrDaemonKept) || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("error %v, want a kept daemon that did not answer", err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), running.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("adopted pod deleted: %v", err)
	}
	if err := m.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatalf("no reference kept for the adopted pod: %v", err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), running.Name, metav1.GetOptions{}); err == nil {
		t.Error("pod not deleted at release")
	}
}

// The daemon pod of a claim with MPS shares on two GPUs sees both GPUs in
// the share's order (the containers' order) and gets each GPU's limit at
// that ordinal.
func TestPodMPSDaemonTwoGPUs(t *testing.T) {
	cs := fake.NewClientset()
	ctl := &fakeControl{up: true}
	d, _ := newTestPodDaemon(t, cs, ctl)
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "pair", Cores: 50, GPUs: []Device{
		{GPU: GPU{Index: 3, UUID: "GPU-3"}, MemoryBytes: 8000 << 20},
		{GPU: GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: 2 * gib},
	}}
	dirs := m.Dirs(share)
	pod := d.pod(share, dirs, nil)
	var visible []string
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "CUDA_VISIBLE_DEVICES" {
			visible = append(visible, e.Value)
		}
	}
	if !slices.Equal(visible, []string{"GPU-3,GPU-1"}) {
		t.Errorf("daemon pod CUDA_VISIBLE_DEVICES %q, want GPU-3,GPU-1", visible)
	}
	if err := d.setLimits(t.Context(), share, dirs); err != nil {
		t.Fatal(err)
	}
	want := []string{"set_default_active_thread_percentage 50", "set_default_device_pinned_mem_limit 0 8000M", "set_default_device_pinned_mem_limit 1 2048M"}
	if !slices.Equal(ctl.commands, want) {
		t.Errorf("control commands %q, want %q", ctl.commands, want)
	}
	for _, e := range ctl.envs {
		if !slices.Contains(e, "CUDA_VISIBLE_DEVICES=GPU-3,GPU-1") {
			t.Errorf("control client env %q lacks both GPUs", e)
		}
	}
	// A GPU whose limit is under 1Mi is refused before any command.
	ctl.commands = nil
	bad := share
	bad.GPUs = []Device{share.GPUs[0], {GPU: GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: 1000}}
	if err := d.setLimits(t.Context(), bad, dirs); err == nil || !strings.Contains(err.Error(), "GPU-1") {
		t.Errorf("error %v, want GPU-1's limit refused", err)
	}
	if len(ctl.commands) != 0 {
		t.Errorf("commands sent before the refusal: %q", ctl.commands)
	}
	if err := m.EnsureDaemon(t.Context(), Share{Claim: "none", Cores: 10}); err == nil || !strings.Contains(err.Error(), "no GPU") {
		t.Errorf("share without GPUs: error %v", err)
	}
}

// TestRemoveOrphans: at plugin start, this node's daemon pods and MPS
// directories of claims that are not prepared are removed (pods left
// Failed by a reboot, daemons of a lost checkpoint); kept claims, held
// references, other nodes' daemons and pods that are not daemon pods stay.
func TestRemoveOrphans(t *testing.T) {
	const (
		kept      = "11111111-0000-0000-0000-000000000001"
		orphan    = "11111111-0000-0000-0000-000000000002"
		dirOnly   = "11111111-0000-0000-0000-000000000003"
		held      = "11111111-0000-0000-0000-000000000004"
		elsewhere = "11111111-0000-0000-0000-000000000005"
	)
	daemonPod := func(name, node, claim string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpulink", Labels: map[string]string{
				mpsComponentLabel: mpsComponentValue, mpsNodeLabel: node, mpsClaimLabel: claim}},
			Spec:   corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodFailed},
		}
	}
	cs := fake.NewClientset(
		daemonPod("gpulink-mps-"+kept, "n1", kept),
		daemonPod("gpulink-mps-"+orphan, "n1", orphan),
		daemonPod("gpulink-mps-"+elsewhere, "n2", elsewhere),
		// Labelled like a daemon but named otherwise: not ours.
		daemonPod("gpulink-controller-abc", "n1", "whatever"),
	)
	d, _ := newTestPodDaemon(t, cs, &fakeControl{})
	root := t.TempDir()
	m := NewManager(root, d)
	for _, id := range []string{kept, orphan, dirOnly} {
		if err := m.Dirs(Share{Claim: types.UID(id)}).create(); err != nil {
			t.Fatal(err)
		}
	}
	// A reference taken since start (a prepare racing the cleanup) is kept
	// even if the caller's keep set does not name it.
	m.(*mpsManager).refs[held] = 1

	removed, err := m.RemoveOrphans(t.Context(), map[string]bool{kept: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{orphan, dirOnly}; !slices.Equal(removed, []string{orphan, dirOnly}) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	pods, err := cs.CoreV1().Pods("gpulink").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pods.Items {
		left = append(left, p.Name)
	}
	slices.Sort(left)
	if want := []string{"gpulink-controller-abc", "gpulink-mps-" + kept, "gpulink-mps-" + elsewhere}; !slices.Equal(left, want) {
		t.Errorf("pods left %v, want %v", left, want)
	}
	for id, want := range map[string]bool{kept: true, orphan: false, dirOnly: false} {
		if _, err := os.Stat(filepath.Join(root, id)); (err == nil) != want {
			t.Errorf("directory of claim %s exists: %v, want %v", id, err == nil, want)
		}
	}
}

// TestReassertLimits: the claim's limits are set again on its daemon, the
// defaults and the active thread percentage of each running server, so a
// container that raised them through its pipe directory loses that
// (nothing here runs a real daemon: the commands are checked).
func TestReassertLimits(t *testing.T) {
	ctl := &fakeControl{up: true, servers: "4242\n4243\n"}
	d, _ := newTestPodDaemon(t, fake.NewClientset(), ctl)
	m := NewManager(t.TempDir(), d).(*mpsManager)
	share := Share{Claim: "33333333-2222-3333-4444-555555555555", Cores: 30,
		GPUs: []Device{{GPU: GPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: 5 * gib}, {GPU: GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: 3 * gib}}}
	// Held as after a prepare (Start itself is tested above).
	m.refs[share.ID()] = 1
	m.shares[share.ID()] = share
	if failed, err := m.ReassertLimits(t.Context()); err != nil || len(failed) != 0 {
		t.Fatalf("ReassertLimits: %v (failed %v)", err, failed)
	}
	want := []string{
		"set_default_active_thread_percentage 30",
		"set_default_device_pinned_mem_limit 0 5120M",
		"set_default_device_pinned_mem_limit 1 3072M",
		"get_server_list",
		"set_active_thread_percentage 4242 30",
		"set_active_thread_percentage 4243 30",
	}
	if !slices.Equal(ctl.commands, want) {
		t.Errorf("commands %q, want %q", ctl.commands, want)
	}
	for _, env := range ctl.envs {
		if !slices.Contains(env, "CUDA_MPS_PIPE_DIRECTORY="+m.Dirs(share).Pipe) {
			t.Errorf("command sent without the claim's pipe directory: %v", env)
		}
	}

	// A daemon that refuses is reported by claim; one released meanwhile
	// is not (its daemon is gone).
	ctl.failCmd = "set_active_thread_percentage"
	failed, err := m.ReassertLimits(t.Context())
	if err == nil || !slices.Equal(failed, []string{share.ID()}) || !strings.Contains(err.Error(), "4242") {
		t.Errorf("refused command: failed %v, err %v", failed, err)
	}
	if err := m.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	ctl.commands = nil
	if failed, err := m.ReassertLimits(t.Context()); err != nil || len(failed) != 0 || len(ctl.commands) != 0 {
		t.Errorf("after release: commands %q, failed %v, err %v", ctl.commands, failed, err)
	}
}

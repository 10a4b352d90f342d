package mps

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// fakeKubelet is the kubelet's device plugin registration service on
// kubelet.sock in a directory.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir string
	srv *grpc.Server

	mu   sync.Mutex
	regs []*pluginapi.RegisterRequest
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.regs = append(k.regs, r)
	return &pluginapi.Empty{}, nil
}

// registered returns the registrations so far.
func (k *fakeKubelet) registered() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*pluginapi.RegisterRequest(nil), k.regs...)
}

// waitRegistrations waits until n registrations arrived.
func (k *fakeKubelet) waitRegistrations(t *testing.T, n int) []*pluginapi.RegisterRequest {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r := k.registered(); len(r) >= n {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("got %d registrations, want %d", len(k.registered()), n)
	return nil
}

// dial connects to a registered plugin's endpoint, as the kubelet does.
func dial(t *testing.T, dir string, r *pluginapi.RegisterRequest) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// shortTempDir keeps unix socket paths under 108 bytes, which
// t.TempDir's test-named paths may exceed.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gldp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// fakeDevRoot makes a driver root with dev/ and the nodes of GPUs with
// the given minors (regular files: Allocate only checks they exist).
func fakeDevRoot(t *testing.T, minors ...int) string {
	t.Helper()
	root := t.TempDir()
	names := driver.ControlDeviceNodes()
	for _, m := range minors {
		names = append(names, "/dev/nvidia"+strconv.Itoa(m))
	}
	for _, n := range names {
		p := filepath.Join(root, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func runDevicePlugin(t *testing.T, cfg DevicePluginConfig) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	p, err := NewDevicePlugin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func TestMPSDevicePluginServes(t *testing.T) {
	dir := shortTempDir(t)
	root := fakeDevRoot(t, 3, 5)
	// A stale socket of an earlier process is removed; others' stay.
	for _, n := range []string{"gpulink-mps-gpu-9.sock", "other.sock"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kubelet := startFakeKubelet(t, dir)
	gpus := []topology.GPU{{Index: 0, Minor: 3}, {Index: 1, Minor: 5}}
	runDevicePlugin(t, DevicePluginConfig{Dir: dir, GPUs: func() []topology.GPU { return gpus }, DevRoots: func() (string, string) { return root, "/host/driver" }, Slots: 4})

	regs := kubelet.waitRegistrations(t, 2)
	if _, err := os.Stat(filepath.Join(dir, "gpulink-mps-gpu-9.sock")); !os.IsNotExist(err) {
		t.Errorf("stale socket: %v, want removed", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "other.sock")); err != nil {
		t.Errorf("another plugin's socket: %v, want kept", err)
	}
	byResource := map[string]*pluginapi.RegisterRequest{}
	for _, r := range regs {
		if r.Version != pluginapi.Version {
			t.Errorf("registration %s: version %q", r.ResourceName, r.Version)
		}
		byResource[r.ResourceName] = r
	}
	r0, r1 := byResource["mps-daemon.gpu.gpulink.dev/gpu-0"], byResource["mps-daemon.gpu.gpulink.dev/gpu-1"]
	if r0 == nil || r1 == nil || len(byResource) != 2 {
		t.Fatalf("registered %v, want one resource per GPU", byResource)
	}
	if !strings.HasPrefix(r0.Endpoint, "gpulink-mps-") || !strings.HasSuffix(r0.Endpoint, "-gpu-0.sock") || strings.Contains(r0.Endpoint, "/") {
		t.Errorf("endpoint %q, want a socket name in the device plugin directory", r0.Endpoint)
	}

	c := dial(t, dir, r1)
	ctx := t.Context()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("slot %s: %s", d.ID, d.Health)
		}
		ids = append(ids, d.ID)
	}
	if got, want := strings.Join(ids, ","), "gpu-1-slot-00,gpu-1-slot-01,gpu-1-slot-02,gpu-1-slot-03"; got != want {
		t.Errorf("ListAndWatch advertises %s, want %s", got, want)
	}

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-1-slot-02"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 1 {
		t.Fatalf("%d container responses, want 1", len(resp.ContainerResponses))
	}
	cr := resp.ContainerResponses[0]
	var got []string
	for _, d := range cr.Devices {
		got = append(got, d.ContainerPath+"="+d.HostPath+":"+d.Permissions)
	}
	want := "/dev/nvidia5=/host/driver/dev/nvidia5:rw,/dev/nvidiactl=/host/driver/dev/nvidiactl:rw,/dev/nvidia-uvm=/host/driver/dev/nvidia-uvm:rw,/dev/nvidia-uvm-tools=/host/driver/dev/nvidia-uvm-tools:rw"
	if strings.Join(got, ",") != want {
		t.Errorf("Allocate gives %s, want exactly %s", strings.Join(got, ","), want)
	}
	if len(cr.Mounts) != 0 || len(cr.Envs) != 0 || len(cr.CdiDevices) != 0 || len(cr.Annotations) != 0 {
		t.Errorf("Allocate gives more than device nodes: %v", cr)
	}

	for _, id := range []string{"gpu-0-slot-00", "gpu-1-slot-04", "bogus"} {
		_, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), id) || !strings.Contains(err.Error(), "mps-daemon.gpu.gpulink.dev/gpu-1") {
			t.Errorf("Allocate(%s): %v, want InvalidArgument naming the ID and the resource", id, err)
		}
	}
}

func TestMPSDevicePluginMissingNode(t *testing.T) {
	dir := shortTempDir(t)
	root := fakeDevRoot(t) // control nodes only: no /dev/nvidia0
	kubelet := startFakeKubelet(t, dir)
	runDevicePlugin(t, DevicePluginConfig{Dir: dir, GPUs: func() []topology.GPU { return []topology.GPU{{Index: 0, Minor: 0}} }, DevRoots: func() (string, string) { return root, root }})
	c := dial(t, dir, kubelet.waitRegistrations(t, 1)[0])
	_, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-0-slot-00"}}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), filepath.Join(root, "dev/nvidia0")) {
		t.Errorf("Allocate with a missing device node: %v, want FailedPrecondition naming it", err)
	}
}

// TestMPSDevicePluginReregisters: a kubelet restart removes every socket
// of the directory and recreates kubelet.sock; the plugin serves and
// registers again. A kubelet that is not there yet is waited for.
func TestMPSDevicePluginReregisters(t *testing.T) {
	dir := shortTempDir(t)
	root := fakeDevRoot(t, 0)
	runDevicePlugin(t, DevicePluginConfig{Dir: dir, GPUs: func() []topology.GPU { return []topology.GPU{{Index: 0, Minor: 0}} }, DevRoots: func() (string, string) { return root, root }})
	time.Sleep(100 * time.Millisecond) // polls without a kubelet
	first := startFakeKubelet(t, dir)
	first.waitRegistrations(t, 1)

	// The restart: the old kubelet goes, its socket and the plugins' are
	// removed, a new kubelet listens.
	first.srv.Stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	second := startFakeKubelet(t, dir)
	r := second.waitRegistrations(t, 1)[0]
	if r.ResourceName != "mps-daemon.gpu.gpulink.dev/gpu-0" {
		t.Errorf("re-registered %s", r.ResourceName)
	}
	// The new socket serves.
	stream, err := dial(t, dir, r).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := stream.Recv(); err != nil || len(l.Devices) != DefaultDaemonSlots {
		t.Fatalf("after re-registration: %v devices, %v; want %d", l, err, DefaultDaemonSlots)
	}
	if len(first.registered()) != 1 {
		t.Errorf("the old kubelet got %d registrations", len(first.registered()))
	}
}

func TestMPSDaemonResourceName(t *testing.T) {
	got := DaemonResourceName(12)
	if got != "mps-daemon.gpu.gpulink.dev/gpu-12" {
		t.Errorf("got %s", got)
	}
	// What the kubelet's registration and the API server's pod validation
	// require of an extended resource name.
	if errs := validation.IsQualifiedName(string(got)); len(errs) > 0 {
		t.Errorf("%s is not a qualified name: %v", got, errs)
	}
	// The API server's extended resource rule: domain-prefixed outside
	// kubernetes.io, and usable as a quota's requests.<name>.
	domain, _, ok := strings.Cut(string(got), "/")
	if !ok || domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		t.Errorf("%s is not domain-prefixed outside kubernetes.io", got)
	}
	if errs := validation.IsQualifiedName("requests." + string(got)); len(errs) > 0 {
		t.Errorf("requests.%s is not a qualified name: %v", got, errs)
	}
}

// During a rolling update of the kubelet plugin two instances serve the
// MPS daemon device plugin on one node. The new one must not remove the
// old one's sockets as stale, and the old one, stopping, must not remove
// the new one's: otherwise the kubelet loses the resources until the new
// instance notices and registers again (registration flaps).
func TestMPSDevicePluginRollingUpdate(t *testing.T) {
	dir := shortTempDir(t)
	root := fakeDevRoot(t, 0)
	kubelet := startFakeKubelet(t, dir)
	cfg := DevicePluginConfig{Dir: dir, GPUs: func() []topology.GPU { return []topology.GPU{{Index: 0, Minor: 0}} }, DevRoots: func() (string, string) { return root, root },
		// Polls only once within the test: what is checked is what each
		// instance does to the other's sockets, not how fast it repairs.
		PollInterval: time.Hour}
	start := func() (stop func()) {
		p, err := NewDevicePlugin(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	serves := func(r *pluginapi.RegisterRequest, who string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(dir, r.Endpoint)); err != nil {
			t.Fatalf("%s: socket %s: %v", who, r.Endpoint, err)
		}
		stream, err := dial(t, dir, r).ListAndWatch(t.Context(), &pluginapi.Empty{})
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil {
			t.Fatalf("%s: %s does not serve: %v", who, r.Endpoint, err)
		}
	}
	stopOld := start()
	old := kubelet.waitRegistrations(t, 1)[0]
	stopNew := start()
	defer stopNew()
	regs := kubelet.waitRegistrations(t, 2)
	current := regs[1]
	serves(old, "the old instance, after the new one started")
	serves(current, "the new instance")
	// The old instance ends, as a rolling update stops it.
	stopOld()
	serves(current, "the new instance, after the old one stopped")
	if n := len(kubelet.registered()); n != 2 {
		t.Errorf("%d registrations, want one per instance", n)
	}
}

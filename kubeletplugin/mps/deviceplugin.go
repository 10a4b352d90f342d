package mps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// DaemonResourceDomain prefixes the extended resources the MPS daemon
// device plugin advertises, one per GPU: mps-daemon.gpu.gpulink.dev/gpu-<index>.
// Extended resource names must be domain-prefixed outside kubernetes.io;
// one resource per GPU (rather than one for all GPUs) lets a daemon pod ask
// for exactly its claim's GPUs, since the kubelet picks the device IDs of
// a resource and the plugin could not steer it to a particular GPU.
const DaemonResourceDomain = "mps-daemon." + driver.Name

// DaemonResourceName is the extended resource of the GPU with that
// index: an MPS daemon pod asks for one of it to get the GPU's device
// nodes.
func DaemonResourceName(index int) corev1.ResourceName {
	return corev1.ResourceName(DaemonResourceDomain + "/" + driver.DeviceName(index))
}

// DefaultDaemonSlots is how many daemon pods may hold one GPU's
// resource at a time: one per claim with an MPS share on it. Shares are
// at least 1 % of the cores and a few MiB of memory, so more than 64 on one
// GPU would be useless anyway; the count only has to exceed what the
// controller ever places there.
const DefaultDaemonSlots = 64

// KubeletDevicePluginDir is the kubelet's device plugin directory:
// kubelet.sock and the plugins' sockets. The kubelet (1.37) uses this
// fixed path (pluginapi.KubeletSocket) whatever its --root-dir.
const KubeletDevicePluginDir = "/var/lib/kubelet/device-plugins"

// mpsSocketPrefix starts the names of this plugin's sockets in the
// device plugin directory, so that stale ones can be told from others'.
// Each DevicePlugin adds an instance tag of its own: during a rolling
// update two plugin processes serve on one node, and with shared names
// each would delete the other's sockets (at start as stale, at stop as
// its own) and the kubelet's registrations would flap.
const mpsSocketPrefix = "gpulink-mps-"

// DevicePluginConfig configures DevicePlugin.
type DevicePluginConfig struct {
	// Dir is the kubelet's device plugin directory (kubelet.sock).
	Dir string
	// GPUs returns the node's GPUs; read at every (re)start, so that a
	// rediscovery that changes the GPUs restarts the servers.
	GPUs func() []topology.GPU
	// DevRoots returns the directory holding dev/ as this process sees it
	// and on the host, as the claims' CDI specs locate device nodes
	// (kubeletplugin.DriverRoot.DevRoots); asked at every (re)start.
	DevRoots func() (mount, host string)
	// Slots per GPU (DefaultDaemonSlots when zero).
	Slots int
	// PollInterval is how often kubelet.sock, the plugin's sockets and the
	// GPUs are checked for a change (1s when zero).
	PollInterval time.Duration
}

// DevicePlugin is a kubelet device plugin that hands the MPS control
// daemon pods their GPUs' device nodes, so that they need not be
// privileged: Kubernetes gives an unprivileged container host device nodes
// only through a device plugin or a DRA claim, and a daemon pod cannot
// hold its claim's DRA allocation (that would make it a second consumer of
// the claim the controller allocated for the user's pods). It serves one
// resource per GPU (DaemonResourceName), each with Slots interchangeable
// device IDs, and its Allocate returns that GPU's /dev/nvidia<minor>,
// /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools, nothing else.
// The resources are only requested by PodDaemon's pods; a user's pod
// asking for one gets device nodes it could get from a claim anyway, but
// no limits: the controller does not count these, so see docs/security.md.
type DevicePlugin struct {
	cfg DevicePluginConfig
	// tag tells this process's sockets from another instance's.
	tag string

	mu      sync.Mutex
	servers []*mpsGPUServer
}

// NewDevicePlugin checks the configuration; Run serves.
func NewDevicePlugin(cfg DevicePluginConfig) (*DevicePlugin, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("MPS daemon device plugin: the kubelet's device plugin directory is empty")
	case cfg.GPUs == nil:
		return nil, errors.New("MPS daemon device plugin: no GPU source")
	case cfg.DevRoots == nil:
		return nil, errors.New("MPS daemon device plugin: no device node root")
	}
	if cfg.Slots == 0 {
		cfg.Slots = DefaultDaemonSlots
	}
	if cfg.Slots < 1 {
		return nil, fmt.Errorf("MPS daemon device plugin: %d slots per GPU, want at least 1", cfg.Slots)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("MPS daemon device plugin: instance tag: %w", err)
	}
	return &DevicePlugin{cfg: cfg, tag: hex.EncodeToString(b[:])}, nil
}

// kubeletSocket is the kubelet's registration socket.
func (p *DevicePlugin) kubeletSocket() string {
	return filepath.Join(p.cfg.Dir, filepath.Base(pluginapi.KubeletSocket))
}

// Run serves one device plugin per GPU and registers each with the
// kubelet, until ctx ends. It starts over (new sockets, new registrations)
// whenever kubelet.sock is replaced (a kubelet restart, which also deletes
// every plugin socket in the directory), one of its sockets disappears,
// registration failed, or the GPUs changed. Failures are logged and
// retried at the next poll: the kubelet may start after the plugin.
func (p *DevicePlugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("mps-device-plugin")
	ctx = klog.NewContext(ctx, logger)
	defer p.stopServers()
	if err := p.removeStaleSockets(); err != nil {
		return err
	}
	var (
		kubelet  fileID
		gpus     []topology.GPU
		healthy  bool
		failures int
	)
	ticker := time.NewTicker(p.cfg.PollInterval)
	defer ticker.Stop()
	for {
		now, err := statID(p.kubeletSocket())
		current := p.cfg.GPUs()
		switch {
		case err != nil:
			if healthy || failures == 0 {
				logger.Info("Waiting for the kubelet's device plugin socket", "path", p.kubeletSocket(), "reason", err.Error())
			}
			p.stopServers()
			healthy, kubelet = false, fileID{}
			failures++
		case !healthy || now != kubelet || !sameGPUs(gpus, current) || !p.socketsPresent():
			if healthy {
				logger.Info("Kubelet restarted, a socket was removed or the GPUs changed: registering again")
			}
			p.stopServers()
			if err := p.startAndRegister(ctx, current); err != nil {
				// Logged at every few attempts only: a node without
				// a kubelet yet would fill the log every second.
				if failures%30 == 0 {
					logger.Error(err, "Serving the MPS daemon device plugin failed, retrying")
				}
				p.stopServers()
				healthy = false
				failures++
				break
			}
			healthy, kubelet, gpus, failures = true, now, current, 0
			logger.Info("Registered the MPS daemon device plugin with the kubelet", "resources", len(current), "slots", p.cfg.Slots)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// fileID tells a file from its replacement.
type fileID struct {
	dev, ino uint64
	mtime    time.Time
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	id := fileID{mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino //nolint:unconvert // Dev's type differs per platform
	}
	return id, nil
}

// sameGPUs compares what the servers depend on: indexes and minors.
func sameGPUs(a, b []topology.GPU) bool {
	return slices.EqualFunc(a, b, func(x, y topology.GPU) bool { return x.Index == y.Index && x.Minor == y.Minor })
}

// removeStaleSockets removes sockets a previous process left behind: the
// kubelet would otherwise keep dialling them until it notices. A socket
// that accepts a connection is another instance's (a rolling update) and
// stays, and so does one whose state a dial does not tell: only a refused
// connection (no listener) or a vanished file is a definite "stale".
func (p *DevicePlugin) removeStaleSockets() error {
	entries, err := os.ReadDir(p.cfg.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the kubelet's device plugin directory %s: %w", p.cfg.Dir, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), mpsSocketPrefix) || !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		path := filepath.Join(p.cfg.Dir, e.Name())
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = conn.Close()
			continue // served by another instance
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing stale device plugin socket: %w", err)
		}
	}
	return nil
}

// socketsPresent reports whether every server's socket is still there
// (the kubelet removes them all when it starts).
func (p *DevicePlugin) socketsPresent() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.servers {
		if _, err := os.Stat(s.socket); err != nil {
			return false
		}
	}
	return true
}

// startAndRegister starts a server for each GPU and registers it.
func (p *DevicePlugin) startAndRegister(ctx context.Context, gpus []topology.GPU) error {
	devMount, devHost := p.cfg.DevRoots()
	for _, g := range gpus {
		s := newMPSGPUServer(g, p.cfg.Slots, devMount, devHost, filepath.Join(p.cfg.Dir, mpsSocketPrefix+p.tag+"-"+driver.DeviceName(g.Index)+".sock"))
		if err := s.serve(klog.FromContext(ctx)); err != nil {
			return err
		}
		p.mu.Lock()
		p.servers = append(p.servers, s)
		p.mu.Unlock()
		if err := p.register(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// register announces one server to the kubelet.
func (p *DevicePlugin) register(ctx context.Context, s *mpsGPUServer) error {
	conn, err := grpc.NewClient("unix://"+p.kubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet at %s: %w", p.kubeletSocket(), err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("registering device plugin %s with the kubelet at %s: %w", s.resource, p.kubeletSocket(), err)
	}
	return nil
}

// stopServers stops every server and removes its socket.
func (p *DevicePlugin) stopServers() {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, s := range servers {
		s.stop()
	}
}

// mpsGPUServer is the device plugin of one GPU's resource.
type mpsGPUServer struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	socket   string
	ids      []string
	// nodes are the device nodes Allocate hands out: container path and
	// the path this process checks them at (seen), plus the host path.
	nodes []mpsDeviceNode

	srv  *grpc.Server
	done chan struct{}
}

type mpsDeviceNode struct{ path, seen, host string }

func newMPSGPUServer(g topology.GPU, slots int, devMount, devHost, socket string) *mpsGPUServer {
	s := &mpsGPUServer{
		resource: string(DaemonResourceName(g.Index)),
		socket:   socket,
		done:     make(chan struct{}),
	}
	for i := range slots {
		s.ids = append(s.ids, mpsSlotID(g.Index, i))
	}
	for _, path := range append([]string{"/dev/nvidia" + strconv.Itoa(g.Minor)}, driver.ControlDeviceNodes()...) {
		s.nodes = append(s.nodes, mpsDeviceNode{path: path, seen: filepath.Join(devMount, path), host: filepath.Join(devHost, path)})
	}
	return s
}

// mpsSlotID names slot i of the GPU with that index.
func mpsSlotID(index, i int) string { return fmt.Sprintf("%s-slot-%02d", driver.DeviceName(index), i) }

func (s *mpsGPUServer) serve(logger klog.Logger) error {
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing old device plugin socket: %w", err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listening on device plugin socket %s: %w", s.socket, err)
	}
	s.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s.srv, s)
	go func() {
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logger.Error(err, "Device plugin server stopped", "resource", s.resource)
		}
	}()
	return nil
}

func (s *mpsGPUServer) stop() {
	close(s.done)
	if s.srv != nil {
		s.srv.Stop()
	}
	_ = os.Remove(s.socket)
}

// GetDevicePluginOptions: no PreStartContainer, no preferred allocation
// (slots are interchangeable).
func (s *mpsGPUServer) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the GPU's slots, all healthy, and keeps the stream
// open until the server stops. A GPU's health does not matter here: its
// daemon is needed for the claims already on it, and the DRA slices keep
// new claims off an unhealthy GPU.
func (s *mpsGPUServer) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range s.ids {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return fmt.Errorf("sending the slots of %s: %w", s.resource, err)
	}
	select {
	case <-s.done:
	case <-stream.Context().Done():
	}
	return nil
}

// Allocate gives each container the GPU's device node and the control
// nodes, read-write (no mknod), whatever number of slots it asked for.
// IDs that are not this GPU's slots are refused: the kubelet only sends
// advertised IDs, so anything else is a bug or a stale checkpoint.
func (s *mpsGPUServer) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if !slices.Contains(s.ids, id) {
				return nil, status.Errorf(codes.InvalidArgument, "device ID %q is not a slot of %s (%s..%s)", id, s.resource, s.ids[0], s.ids[len(s.ids)-1])
			}
		}
		cr := &pluginapi.ContainerAllocateResponse{}
		for _, n := range s.nodes {
			// A missing node would fail the container's creation with a
			// runtime error that does not say which resource gave it.
			if _, err := os.Stat(n.seen); err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "%s: device node %s: %v", s.resource, n.host, err)
			}
			cr.Devices = append(cr.Devices, &pluginapi.DeviceSpec{ContainerPath: n.path, HostPath: n.host, Permissions: "rw"})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

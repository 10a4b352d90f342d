package localcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

var getOpts = metav1.GetOptions{}

// maxSocketPath is the longest usable Unix socket path (sun_path is 108
// bytes including the terminating NUL) minus room for suffixes such as
// ".ttrpc".
const maxSocketPath = 100

// buildTestImages builds the images a real node imports. It may run on its
// own goroutine, so it does not log.
func (c *Cluster) buildTestImages(ctx context.Context) ([]string, error) {
	dir, err := defaultDir(c.opts.ImageDir, "GPULINK_IMAGE_DIR", "images")
	if err != nil {
		return nil, err
	}
	var tars []string
	for _, img := range testImages {
		tar, err := BuildImage(ctx, img.pkg, img.ref, dir)
		if err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		tars = append(tars, tar)
	}
	return tars, nil
}

// startNode starts containerd and the kubelet, imports the images and waits
// until the node is Ready and schedulable.
func (c *Cluster) startNode(ctx context.Context, images []string) error {
	start := time.Now()
	runc, err := lookPath("runc", "/usr/sbin/runc", "/usr/bin/runc")
	if err != nil {
		return fmt.Errorf("localcluster: runc not found (hack/cluster.sh build installs Debian's runc): %w", err)
	}
	cniBin := "/usr/lib/cni"
	if _, err := os.Stat(filepath.Join(cniBin, "loopback")); err != nil {
		return fmt.Errorf("localcluster: CNI loopback plugin missing in %s (hack/cluster.sh build installs Debian's containernetworking-plugins): %w", cniBin, err)
	}
	c.containerdSocket = filepath.Join(c.dir, "containerd", "containerd.sock")
	if len(c.containerdSocket) > maxSocketPath {
		return fmt.Errorf("localcluster: state directory %s is too long for Unix sockets (%s has %d bytes, at most %d)",
			c.dir, c.containerdSocket, len(c.containerdSocket), maxSocketPath)
	}
	c.cgroupRoot = "/gpulink-" + randomHex(12)
	if err := createCgroups(c.cgroupRoot); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	c.cgroupsCreated = true
	c.saveState()

	if err := c.startContainerd(ctx, runc, cniBin); err != nil {
		return err
	}
	for _, img := range images {
		if err := c.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := c.startKubelet(ctx); err != nil {
		return err
	}
	c.logf("node %s ready after %.1fs", c.opts.NodeName, time.Since(start).Seconds())
	return nil
}

func lookPath(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, f := range fallbacks {
		if _, err := os.Stat(f); err == nil {
			return f, nil
		}
	}
	return "", fmt.Errorf("%s not in PATH nor at %s", name, strings.Join(fallbacks, ", "))
}

func (c *Cluster) startContainerd(ctx context.Context, runc, cniBin string) error {
	start := time.Now()
	base := filepath.Join(c.dir, "containerd")
	cniConf := filepath.Join(base, "cni")
	for _, d := range []string{base, cniConf, filepath.Join(base, "root"), filepath.Join(base, "state"), filepath.Join(base, "opt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("localcluster: creating containerd directory: %w", err)
		}
	}
	// Only hostNetwork pods are supported: the node has no pod network, but
	// containerd reports NetworkReady (and so the kubelet Ready) only with a
	// CNI configuration.
	const loopback = `{"cniVersion": "1.0.0", "name": "gpulink-loopback", "plugins": [{"type": "loopback"}]}` + "\n"
	if err := os.WriteFile(filepath.Join(cniConf, "10-loopback.conflist"), []byte(loopback), 0o644); err != nil {
		return fmt.Errorf("localcluster: writing CNI configuration: %w", err)
	}
	q := func(s string) string { return "'" + s + "'" } // TOML literal string
	config := fmt.Sprintf(`version = 3
root = %[1]s
state = %[2]s
disabled_plugins = ['io.containerd.nri.v1.nri']

[grpc]
  address = %[3]s

[ttrpc]
  address = %[4]s

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]s

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]s

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [%[7]s]
  # Without CAP_SYS_RESOURCE (Firecracker VMs) runc fails to lower
  # oom_score_adj below the parent's.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[8]s
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[9]s]
    conf_dir = %[10]s
`, q(filepath.Join(base, "root")), q(filepath.Join(base, "state")), q(c.containerdSocket), q(c.containerdSocket+".ttrpc"),
		q(filepath.Join(base, "opt")), q(PauseImage), q(c.CDIDir()), q(runc), q(cniBin), q(cniConf))
	configPath := filepath.Join(base, "config.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return fmt.Errorf("localcluster: writing containerd configuration: %w", err)
	}
	p, err := c.startProcess("containerd", c.bin("containerd"), "--config", configPath, "--log-level", "info")
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := waitFor(ctx, p, 60*time.Second, "containerd socket", func(ctx context.Context) (bool, error) {
		conn, err := net.DialTimeout("unix", c.containerdSocket, time.Second)
		if err != nil {
			return false, err
		}
		conn.Close()
		_, err = c.ctr(ctx, "version")
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	c.logf("containerd ready after %.1fs", time.Since(start).Seconds())
	return nil
}

// ctr runs ctr against the cluster's containerd in namespace k8s.io and
// returns its standard output.
func (c *Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin("ctr"), append([]string{"--address", c.containerdSocket, "--namespace", "k8s.io"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var msgs []string
		for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
			// ctr warns about cgroup v1 on every call.
			if line != "" && !strings.Contains(line, "DEPRECATION") {
				msgs = append(msgs, line)
			}
		}
		return stdout.Bytes(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.Join(msgs, " "))
	}
	return stdout.Bytes(), nil
}

// ImportImage imports a docker-archive or OCI tar into the node's containerd
// (namespace k8s.io), where pods with imagePullPolicy: Never find it.
func (c *Cluster) ImportImage(ctx context.Context, tarPath string) error {
	if c.containerdSocket == "" {
		return fmt.Errorf("localcluster: importing %s: the cluster has no real node", tarPath)
	}
	start := time.Now()
	if _, err := c.ctr(ctx, "images", "import", tarPath); err != nil {
		return fmt.Errorf("localcluster: importing image %s: %w", tarPath, err)
	}
	c.logf("imported %s in %.1fs", filepath.Base(tarPath), time.Since(start).Seconds())
	return nil
}

// killAllTasks force-deletes every task (container process) of the node's
// containerd so that no shim outlives it. Containers of a pod share the
// sandbox's shim, so deleting one task may take others with it: it repeats
// until the task list is empty.
func (c *Cluster) killAllTasks() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var lastErrs []string
	for attempt := 0; attempt < 5; attempt++ {
		out, err := c.ctr(ctx, "tasks", "list", "--quiet")
		if err != nil {
			return fmt.Errorf("listing container tasks: %w", err)
		}
		ids := strings.Fields(string(out))
		if len(ids) == 0 {
			return nil
		}
		lastErrs = lastErrs[:0]
		for _, id := range ids {
			if _, err := c.ctr(ctx, "tasks", "delete", "--force", id); err != nil {
				lastErrs = append(lastErrs, err.Error())
			}
		}
	}
	return fmt.Errorf("container tasks survive deletion: %s", strings.Join(lastErrs, "; "))
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	start := time.Now()
	root := c.KubeletRootDir()
	podLogs := c.PodLogDir()
	for _, d := range []string{root, podLogs, filepath.Join(root, "plugins_registry"), filepath.Join(root, "plugins")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("localcluster: creating kubelet directory: %w", err)
		}
	}
	var gates string
	if fg := c.gates(); len(fg) > 0 {
		gates = "featureGates:\n"
		for k, v := range fg {
			gates += fmt.Sprintf("  %s: %t\n", k, v)
		}
	}
	cgroupV1 := ""
	if isCgroupV1() {
		cgroupV1 = "failCgroupV1: false\n"
	}
	// The kubelet refuses a loopback node IP, and the API server reaches
	// kubelets (logs, exec) at the node IP: serve on a host address.
	nodeIP, err := hostIP()
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %q
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: %q
%sfailSwapOn: false
containerRuntimeEndpoint: %q
podLogsDir: %q
clusterDomain: cluster.local
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
  imagefs.inodesFree: 1%%
nodeStatusUpdateFrequency: 4s
%s`, nodeIP, c.kubeletPort, c.kubeletHealthzPort, c.pki.caCert, c.cgroupRoot, cgroupV1,
		"unix://"+c.containerdSocket, podLogs, gates)
	configPath := filepath.Join(c.dir, "pki", "kubelet-config.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return fmt.Errorf("localcluster: writing kubelet configuration: %w", err)
	}
	p, err := c.startProcess("kubelet", c.bin("kubelet"),
		"--config="+configPath,
		"--kubeconfig="+filepath.Join(c.dir, "pki", "kubelet.kubeconfig"),
		"--root-dir="+root,
		"--hostname-override="+c.opts.NodeName,
		"--node-ip="+nodeIP,
		"--v=2",
	)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", c.kubeletHealthzPort)
	if err := waitFor(ctx, p, 120*time.Second, "kubelet /healthz", func(ctx context.Context) (bool, error) {
		return httpOK(ctx, hc, healthz, "")
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := waitFor(ctx, p, 180*time.Second, "node "+c.opts.NodeName+" Ready", func(ctx context.Context) (bool, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.opts.NodeName, getOpts)
		if err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return true, nil
				}
				return false, fmt.Errorf("node Ready=%s: %s: %s", cond.Status, cond.Reason, cond.Message)
			}
		}
		return false, fmt.Errorf("node has no Ready condition yet")
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if err := c.removeNotReadyTaint(ctx, c.opts.NodeName); err != nil {
		return err
	}
	c.logf("kubelet registered node %s after %.1fs", c.opts.NodeName, time.Since(start).Seconds())
	return nil
}

// removeNotReadyTaint removes node.kubernetes.io/not-ready, which nodes get
// on registration and which nothing removes here because the node
// lifecycle controller is off.
func (c *Cluster) removeNotReadyTaint(ctx context.Context, name string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, getOpts)
		if err != nil {
			return err
		}
		var kept []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = kept
		_, err = c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("localcluster: removing the not-ready taint of node %s: %w", name, err)
	}
	return nil
}

// APINodeLabel is set ("true") on the nodes AddAPINode creates: a node
// affinity on it keeps DaemonSets off nodes that have no kubelet to run
// their pods.
const APINodeLabel = "gpulink.io/local-api-node"

// AddAPINode creates a Node without a kubelet: capacity pods 110, cpu 32,
// memory 256Gi, a Ready condition and no not-ready taint, so kube-scheduler
// binds pods (and allocates their claims against ResourceSlices of that
// node) to it. Such pods never run. The node lifecycle controller is off, so
// the node stays Ready. The node has the label APINodeLabel.
func (c *Cluster) AddAPINode(ctx context.Context, name string) error {
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
	}
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				corev1.LabelHostname:   name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
				APINodeLabel:           "true",
			},
		},
	}
	status := corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions: []corev1.NodeCondition{{
			Type:               corev1.NodeReady,
			Status:             corev1.ConditionTrue,
			Reason:             "APINode",
			Message:            "API-only node of the gpulink local cluster (no kubelet)",
			LastHeartbeatTime:  now,
			LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		NodeInfo:  corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64"},
	}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("localcluster: creating API node %s: %w", name, err)
	}
	// Controllers (TTL, taints) update new nodes concurrently.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, getOpts)
		if err != nil {
			return err
		}
		n.Status = status
		_, err = c.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("localcluster: setting status of API node %s: %w", name, err)
	}
	if err := c.removeNotReadyTaint(ctx, name); err != nil {
		return err
	}
	c.logf("API node %s added", name)
	return nil
}

// hostIP returns the first global unicast IPv4 address of an interface that
// is up, else the first such IPv6 address.
func hostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing network interfaces: %w", err)
	}
	var v6 string
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || !ipn.IP.IsGlobalUnicast() {
				continue
			}
			if ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
			if v6 == "" {
				v6 = ipn.IP.String()
			}
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", fmt.Errorf("no non-loopback address on any interface for the kubelet's node IP")
}

func insecureHTTPClient() *http.Client {
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // local health checks of self-signed components
	}
}

// httpOK reports whether GET url answers 200.
func httpOK(ctx context.Context, hc *http.Client, url, token string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return true, nil
}

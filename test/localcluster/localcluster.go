// Package localcluster runs a real Kubernetes 1.37 cluster on 127.0.0.1 for
// gpulink's integration and e2e tests and for hack/cluster.sh: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, optionally a
// real node (containerd v2 with CDI and runc, and a kubelet), and any number
// of API-only nodes (Node objects without a kubelet).
//
// The binaries come from hack/cluster.sh build (_output/bin). The control
// plane listens on 127.0.0.1; the kubelet serves on the host's first
// non-loopback address (kubelets refuse a loopback node IP, and the API
// server reaches kubelets for logs and exec at the node IP) and authenticates
// clients by certificate. Every port is chosen dynamically (and reserved
// against concurrent Starts), every file lives under Options.Dir and the
// kubelet gets its own cgroup root, so several clusters can run at once. A
// real node needs root and runs only hostNetwork pods (no pod network).
//
//	c, err := localcluster.Start(ctx, localcluster.Options{Dir: t.TempDir(), RealNode: true, Logf: t.Logf})
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = c.Stop() })
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1"
	// DefaultNodeName is the name of the real node unless Options.NodeName is set.
	DefaultNodeName = "local-node"
)

// Options configure Start.
type Options struct {
	// Dir is the state directory (t.TempDir() in tests): certificates, etcd
	// data, logs (<Dir>/logs/<component>.log), the admin kubeconfig, the
	// kubelet root, the CDI directory and containerd's root and state all
	// live under it. Keep it short: Unix socket paths under it must stay
	// below 108 bytes. Required.
	Dir string
	// BinDir holds etcd, kube-* and containerd binaries. Default:
	// $GPULINK_BIN_DIR, else <repo>/_output/bin.
	BinDir string
	// ImageDir receives the test image archives built for a real node.
	// Default: $GPULINK_IMAGE_DIR, else <repo>/_output/images.
	ImageDir string
	// RealNode starts containerd v2 (CDI enabled, cdi_spec_dirs = [CDIDir()])
	// and a kubelet registered as node NodeName, and imports PauseImage and
	// WorkloadImage. Needs root.
	RealNode bool
	// NodeName is the real node's name. Default: DefaultNodeName.
	NodeName string
	// FeatureGates are passed to every Kubernetes component.
	FeatureGates map[string]bool
	// Logf receives progress lines. Default: discard.
	Logf func(format string, args ...any)
	// AuditPolicy, when set, is an audit.k8s.io/v1 Policy (YAML) that the
	// API server audits requests by, as JSON lines to AuditLogPath(): how
	// a test learns which identity wrote an object.
	AuditPolicy string
	// ComponentQPS, when set, is the API client rate (queries per second;
	// burst twice that) of kube-controller-manager and kube-scheduler,
	// whose defaults (20 and 50) would throttle tests that create
	// thousands of pods and claims (test/scale).
	ComponentQPS int
	// Profiling serves Go's runtime profiles under /debug/pprof/ on the
	// API server, kube-controller-manager and kube-scheduler (off by
	// default, as their own --profiling is recommended off): how a
	// benchmark learns where the control plane spends its CPU
	// (test/scale's GPULINK_SCHED_PROFILE_DIR).
	Profiling bool
}

// Cluster is a running local cluster.
type Cluster struct {
	opts   Options
	dir    string
	binDir string
	pki    *pki

	procs []*process

	etcdPort, etcdPeerPort           int
	apiserverPort                    int
	schedulerPort, controllerMgrPort int
	kubeletPort, kubeletHealthzPort  int

	kubeconfig       string
	restConfig       *rest.Config
	client           kubernetes.Interface
	containerdSocket string
	cgroupRoot       string
	cgroupsCreated   bool

	portLocks []*os.File

	stopOnce sync.Once
	stopErr  error
}

// Start starts a cluster and returns once it is usable: the API server is
// ready, the scheduler and controller-manager are healthy, the default
// service account exists and, with RealNode, the node is Ready, schedulable
// and has the test images. On failure it stops what it started and returns
// an error that includes the tail of the failing component's log.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	begin := time.Now()
	if opts.Dir == "" {
		return nil, errors.New("localcluster: Options.Dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if opts.NodeName == "" {
		opts.NodeName = DefaultNodeName
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.RealNode && os.Geteuid() != 0 {
		return nil, errors.New("localcluster: a real node needs root (containerd, runc and the kubelet mount file systems and manage cgroups)")
	}
	c := &Cluster{opts: opts, dir: dir}
	if c.binDir, err = defaultDir(opts.BinDir, "GPULINK_BIN_DIR", "bin"); err != nil {
		return nil, err
	}
	for _, b := range c.requiredBinaries() {
		if _, err := os.Stat(filepath.Join(c.binDir, b)); err != nil {
			return nil, fmt.Errorf("localcluster: %s missing in %s (run hack/cluster.sh build): %w", b, c.binDir, err)
		}
	}
	for _, d := range []string{"logs", "etcd", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("localcluster: creating state directory: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			if err := c.Stop(); err != nil {
				c.logf("stopping after failed start: %v", err)
			}
		}
	}()

	ports, locks, err := reservePorts(7)
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	c.portLocks = locks
	c.etcdPort, c.etcdPeerPort, c.apiserverPort = ports[0], ports[1], ports[2]
	c.schedulerPort, c.controllerMgrPort = ports[3], ports[4]
	c.kubeletPort, c.kubeletHealthzPort = ports[5], ports[6]

	if c.pki, err = writePKI(filepath.Join(dir, "pki"), opts.NodeName); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := c.writeKubeconfigs(); err != nil {
		return nil, err
	}

	// A real node's image build runs while the control plane starts.
	var imgs []string
	imgErr := make(chan error, 1)
	if opts.RealNode {
		go func() {
			var err error
			imgs, err = c.buildTestImages(ctx)
			imgErr <- err
		}()
	}
	imgStart := time.Now()

	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.startControllerManagerAndScheduler(ctx); err != nil {
		return nil, err
	}
	if opts.RealNode {
		if err := <-imgErr; err != nil {
			return nil, err
		}
		c.logf("test images built (%.1fs after start)", time.Since(imgStart).Seconds())
		if err := c.startNode(ctx, imgs); err != nil {
			return nil, err
		}
	}
	c.logf("cluster up in %.1fs (API server https://127.0.0.1:%d, kubeconfig %s)",
		time.Since(begin).Seconds(), c.apiserverPort, c.kubeconfig)
	return c, nil
}

func (c *Cluster) requiredBinaries() []string {
	bins := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
	if c.opts.RealNode {
		bins = append(bins, "kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
	}
	return bins
}

func (c *Cluster) logf(format string, args ...any) {
	c.opts.Logf("localcluster: "+format, args...)
}

// defaultDir returns dir, else $env, else <repo>/_output/<sub>.
// DefaultBinDir returns where the binaries are when Options.BinDir is
// empty: $GPULINK_BIN_DIR, else <repo>/_output/bin. The gpulink binaries
// (make build) and helm (hack/helm.sh --build) are built there too.
func DefaultBinDir() (string, error) { return defaultDir("", "GPULINK_BIN_DIR", "bin") }

func defaultDir(dir, env, sub string) (string, error) {
	if dir == "" {
		dir = os.Getenv(env)
	}
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", fmt.Errorf("localcluster: locating _output/%s: %w", sub, err)
		}
		dir = filepath.Join(root, "_output", sub)
	}
	return filepath.Abs(dir)
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.binDir, name) }

// WorkloadGates are on in every component unless Options.FeatureGates
// turns them off: the Workload API (Workload and PodGroup,
// scheduling.k8s.io/v1beta1, and kube-scheduler's gang scheduling),
// PodGroup-level ResourceClaims and PodGroup topology constraints. In
// Kubernetes 1.37.1 (pkg/features/kube_features.go) GenericWorkload and
// DRAWorkloadResourceClaims are beta and off by default,
// TopologyAwareWorkloadScheduling alpha; the API server also serves
// scheduling.k8s.io/v1beta1 (a beta API, off by default), which stores
// nothing while GenericWorkload is off. WorkloadWithJob (alpha, off by
// default; needs GenericWorkload) lets the API server accept a Job's
// spec.scheduling and makes kube-controller-manager's Job controller
// create a Workload and a PodGroup for each new Job that has no owner
// (pkg/controller/job/job_scheduling_manager.go): a gang PodGroup when
// spec.scheduling.schedulingPolicy.gang is set, a basic one otherwise.
// gpulink's gangs are tested through PodGroups with them on, and through
// its labels with them off.
var WorkloadGates = map[string]bool{
	"GenericWorkload":                 true,
	"DRAWorkloadResourceClaims":       true,
	"TopologyAwareWorkloadScheduling": true,
	"WorkloadWithJob":                 true,
}

// gates are WorkloadGates overridden by Options.FeatureGates.
func (c *Cluster) gates() map[string]bool {
	out := map[string]bool{}
	for k, v := range WorkloadGates {
		out[k] = v
	}
	for k, v := range c.opts.FeatureGates {
		out[k] = v
	}
	return out
}

// WorkloadAPI reports whether the cluster serves PodGroups (GenericWorkload on).
func (c *Cluster) WorkloadAPI() bool { return c.gates()["GenericWorkload"] }

func (c *Cluster) featureGates() []string {
	gates := c.gates()
	if len(gates) == 0 {
		return nil
	}
	var kv []string
	for k, v := range gates {
		kv = append(kv, fmt.Sprintf("%s=%t", k, v))
	}
	sort.Strings(kv)
	return []string{"--feature-gates=" + strings.Join(kv, ",")}
}

// Stop stops what Start started, in reverse order: the kubelet, then every
// container task via ctr while containerd still runs, containerd and its
// leftover shims, the control plane. It then removes the node's cgroups and
// lazily unmounts everything mounted under Dir, so Dir can be removed. It
// is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		begin := time.Now()
		var errs []error
		byName := map[string]*process{}
		for _, p := range c.procs {
			byName[p.name] = p
		}
		if p := byName["kubelet"]; p != nil {
			if err := p.stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if p := byName["containerd"]; p != nil {
			if !p.exited() {
				if err := c.killAllTasks(); err != nil {
					errs = append(errs, err)
				}
			}
			if err := p.stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
			if err := killMatching(c.containerdSocket); err != nil {
				errs = append(errs, err)
			}
		}
		for i := len(c.procs) - 1; i >= 0; i-- {
			p := c.procs[i]
			if p.name == "kubelet" || p.name == "containerd" {
				continue
			}
			if err := p.stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if c.cgroupsCreated {
			if err := removeCgroups(c.cgroupRoot); err != nil {
				errs = append(errs, err)
			}
		}
		if err := unmountUnder(c.dir); err != nil {
			errs = append(errs, err)
		}
		if c.opts.RealNode {
			if err := removeContainerLogLinks(c.dir); err != nil {
				errs = append(errs, err)
			}
		}
		for _, f := range c.portLocks {
			f.Close()
		}
		c.stopErr = errors.Join(errs...)
		if c.stopErr != nil {
			c.stopErr = fmt.Errorf("localcluster: stopping: %w", c.stopErr)
		}
		c.logf("cluster stopped in %.1fs", time.Since(begin).Seconds())
	})
	return c.stopErr
}

// RESTConfig returns a config for the admin user (a static token in group
// system:masters). The caller may modify the returned copy.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Kubeconfig returns the path of the admin kubeconfig (<Dir>/kubeconfig).
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// Client returns a clientset for the admin user.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// Dir returns the absolute state directory.
func (c *Cluster) Dir() string { return c.dir }

// NodeName returns the real node's name (Options.NodeName or DefaultNodeName).
func (c *Cluster) NodeName() string { return c.opts.NodeName }

// CDIDir returns the directory containerd reads CDI specs from (<Dir>/cdi).
func (c *Cluster) CDIDir() string { return filepath.Join(c.dir, "cdi") }

// KubeletRootDir returns the kubelet's --root-dir (<Dir>/kubelet): kubelet
// plugins register in <root>/plugins_registry and keep their sockets and
// data in <root>/plugins/<driver>.
func (c *Cluster) KubeletRootDir() string { return filepath.Join(c.dir, "kubelet") }

// PodLogDir returns the real node's pod log directory (see ReadPodLogFile).
func (c *Cluster) PodLogDir() string { return filepath.Join(c.dir, "pod-logs") }

// ContainerdSocket returns the path of containerd's gRPC socket; empty
// without a real node.
func (c *Cluster) ContainerdSocket() string { return c.containerdSocket }

// AuditLogPath returns the API server's audit log (<Dir>/logs/audit.log),
// written only with Options.AuditPolicy.
func (c *Cluster) AuditLogPath() string { return filepath.Join(c.dir, "logs", "audit.log") }

// SchedulerMetrics returns kube-scheduler's /metrics in the Prometheus
// text format.
func (c *Cluster) SchedulerMetrics(ctx context.Context) (string, error) {
	body, err := c.schedulerGet(ctx, "/metrics", 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("localcluster: kube-scheduler metrics: %w", err)
	}
	return string(body), nil
}

// CPUProfile records a CPU profile (pprof format) of the API server
// ("kube-apiserver") or kube-scheduler ("kube-scheduler") for d. The
// cluster must have been started with Options.Profiling.
func (c *Cluster) CPUProfile(ctx context.Context, component string, d time.Duration) ([]byte, error) {
	if !c.opts.Profiling {
		return nil, fmt.Errorf("localcluster: CPU profile of %s: the cluster was started without Options.Profiling", component)
	}
	seconds := strconv.Itoa(max(1, int(d.Seconds())))
	var body []byte
	var err error
	switch component {
	case "kube-apiserver":
		body, err = c.client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", seconds).Timeout(d + time.Minute).DoRaw(ctx)
	case "kube-scheduler":
		body, err = c.schedulerGet(ctx, "/debug/pprof/profile?seconds="+seconds, d+time.Minute)
	default:
		err = fmt.Errorf("no profile served (want kube-apiserver or kube-scheduler)")
	}
	if err != nil {
		return nil, fmt.Errorf("localcluster: CPU profile of %s: %w", component, err)
	}
	return body, nil
}

// schedulerGet reads path from kube-scheduler's secure port.
func (c *Cluster) schedulerGet(ctx context.Context, path string, timeout time.Duration) ([]byte, error) {
	url := fmt.Sprintf("https://127.0.0.1:%d%s", c.schedulerPort, path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	hc := insecureHTTPClient()
	hc.Timeout = timeout
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return body, nil
}

// LogPath returns the log file of a component ("etcd", "kube-apiserver",
// "kube-controller-manager", "kube-scheduler", "containerd", "kubelet").
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.dir, "logs", component+".log")
}

// Command gpulink-controller allocates gpulink ResourceClaims (driver
// gpu.gpulink.dev) with topology awareness and hands the pods to
// kube-scheduler. It parses flags and wires the controller package.
package main

import (
	"context"
	goflag "flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/compat/admission"
	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/internal/kubeclient"
	"github.com/gpulink/gpulink/internal/memlimit"
	"github.com/gpulink/gpulink/internal/serve"
)

type options struct {
	kubeconfig         string
	qps                float32
	burst              int
	contentType        string
	leaderElect        bool
	leaseNamespace     string
	leaseName          string
	leaseDuration      time.Duration
	renewDeadline      time.Duration
	retryPeriod        time.Duration
	metricsAddress     string
	healthAddress      string
	profiling          bool
	workers            int
	planWorkers        int
	resyncPeriod       time.Duration
	unschedulableGrace time.Duration
	nodePacking        string
	gpuPacking         string
	deviceTaintRules   bool
	webhookAddress     string
	webhookCertDir     string
	webhookReusePort   bool
	webhookLimits      admission.Limits
	compatConfig       string
	compatGrace        time.Duration
	mixWindow          int
	rankByStranding    bool
	placeCPUPods       bool
	steerCPUPods       string
	steerScarceNodes   bool
	mixRefresh         int
	holdNamespace      string
	gangHierarchy      []string
	gangPodGroups      string
	gangDefaultLevel   string
	gangDefaultPolicy  string
	gangStarvation     time.Duration
	gangPreferredStarv time.Duration
	gangStrictReserve  time.Duration
	gangRailAttribute  string
}

func main() {
	o := options{}
	fs := pflag.NewFlagSet("gpulink-controller", pflag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty means in-cluster configuration.")
	fs.Float32Var(&o.qps, "kube-api-qps", 200, "Queries per second to the API server.")
	fs.IntVar(&o.burst, "kube-api-burst", 400, "Burst of queries to the API server.")
	fs.StringVar(&o.contentType, "kube-api-content-type", kubeclient.DefaultContentType, "Encoding of the requests to the API server and of its answers and watch events: application/vnd.kubernetes.protobuf (as kube-scheduler) or application/json.")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Run only while holding a Lease, so that one instance decides at a time.")
	fs.StringVar(&o.leaseNamespace, "leader-elect-namespace", envOr("POD_NAMESPACE", "gpulink-system"), "Namespace of the leader election Lease (default: $POD_NAMESPACE or gpulink-system).")
	fs.StringVar(&o.leaseName, "leader-elect-id", "gpulink-controller", "Name of the leader election Lease.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long a lease is valid without renewal.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader retries renewing before giving up.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often candidates retry.")
	fs.StringVar(&o.metricsAddress, "metrics-address", ":8080", "Address for /metrics; empty disables it.")
	fs.BoolVar(&o.profiling, "profiling", false, "Serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ on --metrics-address.")
	fs.StringVar(&o.healthAddress, "health-address", ":8081", "Address for /healthz and /readyz; empty disables it.")
	fs.IntVar(&o.workers, "workers", 32, "Pods processed in parallel (decisions are serialized, API writes overlap).")
	fs.IntVar(&o.planWorkers, "plan-workers", 0, "Goroutines one decision plans nodes with where it plans them one by one (pods with NICs beside their GPUs, gangs' counts of copies per node); 0: one per CPU the process may use, at most 16.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", 10*time.Minute, "Re-examine every watched object this often (0 disables).")
	fs.DurationVar(&o.unschedulableGrace, "unschedulable-grace", 30*time.Second, "Time kube-scheduler gets to bind a pod to the allocated node before the allocation is released.")
	fs.StringVar(&o.nodePacking, "node-packing", string(allocate.Binpack), "Node-level strategy: binpack or spread.")
	fs.StringVar(&o.gpuPacking, "gpu-packing", string(allocate.Binpack), "Strategy for placing shares on GPUs: binpack or spread.")
	fs.BoolVar(&o.deviceTaintRules, "device-taint-rules", true, "Apply DeviceTaintRules to devices as kube-scheduler does (turn off where the DRADeviceTaintRules API is disabled).")
	fs.StringVar(&o.webhookAddress, "webhook-address", "", "Address of the mutating admission webhook that translates device-plugin GPU resources (nvidia.com/gpu, HAMi, aliyun.com/gpu, tencent.com/vcuda-*) into claims; served by every replica; empty disables it.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/etc/gpulink/webhook", "Directory with the webhook's tls.crt and tls.key (reloaded when they change).")
	fs.BoolVar(&o.webhookReusePort, "webhook-reuse-port", false, "Set SO_REUSEPORT on the webhook's socket, so that replicas sharing a node's network (hostNetwork) all serve it.")
	fs.DurationVar(&o.webhookLimits.ReadTimeout, "webhook-read-timeout", admission.DefaultLimits.ReadTimeout, "Longest a webhook request may take from its first byte to its body's last; the peer's connection is closed then.")
	fs.Int64Var(&o.webhookLimits.MaxBodyBytes, "webhook-max-body-bytes", admission.DefaultLimits.MaxBodyBytes, "Largest AdmissionReview the webhook reads (a pod etcd can store fits in the default).")
	fs.IntVar(&o.webhookLimits.MaxInFlight, "webhook-max-in-flight", admission.DefaultLimits.MaxInFlight, "Webhook requests served at once; more are answered 429.")
	fs.Int64Var(&o.webhookLimits.MaxBufferedBytes, "webhook-max-buffered-bytes", admission.DefaultLimits.MaxBufferedBytes, "Bytes of webhook request bodies read and decoded at once (each request reserves its Content-Length); a request that does not fit is answered 429. The webhook's memory for requests is about three times this.")
	fs.StringVar(&o.compatConfig, "compat-config", "", "YAML file naming the translated resource families (see compat.Config); empty: the nvidia.com/* family with HAMi's annotations.")
	fs.DurationVar(&o.compatGrace, "compat-template-grace", 5*time.Minute, "How long a translated ResourceClaimTemplate outlives the last pod admitted with it once no pod references it.")
	fs.BoolVar(&o.rankByStranding, "rank-by-stranding", false, "Rank nodes for pods with one device set by the GPU a placement strands for the recent pods' shapes, counting each node's CPU and memory left (FGD's fragment measure; docs/performance/trace.md); off: by their GPUs alone.")
	fs.BoolVar(&o.placeCPUPods, "place-cpu-pods", false, "Place gated pods that reference no resource claim (the chart's opt-in gate.cpuPods gates them) on the node where their CPU and memory strand the least GPU, as a preferred node affinity kube-scheduler may override (docs/cpu-pods.md); off: their gate is lifted at once.")
	fs.StringVar(&o.steerCPUPods, "steer-cpu-pods", steer.ModeOff, "Steer pods without GPU claims off GPU nodes whose GPUs are still free, without gating them: taint keeps the PreferNoSchedule taint "+steer.TaintKey+" on every node with a gpulink GPU no claim holds, so that kube-scheduler's TaintToleration score sends such pods to nodes whose GPUs are taken, or without GPUs, when one fits (docs/cpu-pods.md; needs patch on nodes); off removes the taints a previous run left, once at start-up.")
	fs.BoolVar(&o.steerScarceNodes, "steer-scarce-nodes", false, "With --steer-cpu-pods=taint and --rank-by-stranding: keep a second PreferNoSchedule taint "+steer.ScarceTaintKey+" on every GPU node all of whose GPUs are idle and that a GPU pod shape the recent mix weighs as scarce could run on (most of a node's cores, a rare model), so that kube-scheduler puts pods without GPU claims there last, and keep the first taint on a node without an idle GPU while a shape at most 1/256 of the unallocated GPU can hold still fits the rest of its shared GPUs (docs/cpu-pods.md); off, or without those two, the taints a previous run left are removed at start-up.")
	fs.IntVar(&o.mixWindow, "size-mix-window", allocate.DefaultHistoryWindow, "Recent whole-GPU requests whose sizes weight what the allocator keeps free (the recent size mix); negative: sizes 1-8 equally.")
	fs.IntVar(&o.mixRefresh, "size-mix-refresh", 0, "Requests between two snapshots of the recent size mix, at most --size-mix-window (0: 64, or the window if smaller).")
	fs.StringVar(&o.holdNamespace, "hold-namespace", envOr("POD_NAMESPACE", ""), "Namespace for hold records: ResourceClaims that keep the GPUs of claims deleted while their pods run counted for kube-scheduler and across restarts. Only the controller and cluster admins should write there (default: $POD_NAMESPACE; empty: such GPUs are kept counted in memory only).")
	fs.StringSliceVar(&o.gangHierarchy, "gang-hierarchy", gang.DefaultKeys, "Node label keys of the cluster's hierarchy above one node, tightest first, for placing gangs (a domain at a level is the nodes with one value of its key); other pods take the first of equally good nodes by these domains, widest first, then by name.")
	fs.StringVar(&o.gangPodGroups, "gang-podgroups", "auto", "Read gangs from PodGroups (spec.schedulingGroup, scheduling.k8s.io/v1beta1): true, false, or auto (when the API server serves them).")
	fs.StringVar(&o.gangDefaultLevel, "gang-default-level", "", "Level (a --gang-hierarchy key or level name such as leaf) for gangs that name none; empty: the lowest level that fits.")
	fs.StringVar(&o.gangDefaultPolicy, "gang-default-policy", string(gangs.Preferred), "Required or Preferred, for --gang-default-level.")
	fs.DurationVar(&o.gangStarvation, "gang-starvation-bound", 15*time.Minute, "A gang that waited longer than this reserves the domain it is closest to fitting in until it is placed (one gang at a time, the one of the highest level first); 0 disables.")
	fs.DurationVar(&o.gangPreferredStarv, "gang-preferred-starvation-bound", 4*time.Hour, "The starvation bound of a gang whose level is not Required (it may span any domain that holds it); 0: --gang-starvation-bound.")
	fs.DurationVar(&o.gangStrictReserve, "gang-strict-reservation-bound", 8*time.Hour, "Until the gang holding the reservation has waited this long, pods that fit nowhere else, and gangs that would span a wider domain elsewhere, may still be placed on its domain; after it, none. 0 or not above the gang's starvation bound: strict from the start.")
	fs.StringVar(&o.gangRailAttribute, "gang-rail-attribute", "", "Fully qualified attribute (domain/name) of NIC devices that names their rail, for gangs with gpu.gpulink.dev/gang-rails: aligned; empty: a NIC's position among its driver's devices of the node in natural name order.")
	klogFlags := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := klog.Background().WithName("gpulink-controller")
	mem, err := memlimit.Apply(os.Getenv, debug.SetMemoryLimit)
	if err != nil {
		logger.Error(err, "Go memory limit")
		klog.Flush()
		os.Exit(2)
	}
	if mem.LimitBytes > 0 {
		logger.Info("Go memory limit", "containerLimitBytes", mem.ContainerBytes, "softLimitBytes", mem.LimitBytes)
	} else {
		logger.Info("Go memory limit left as it is", "reason", mem.Reason)
	}
	if err := runUntilSignalled(klog.NewContext(context.Background(), logger), o); err != nil {
		logger.Error(err, "Controller failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// runUntilSignalled runs the controller until SIGINT or SIGTERM. It is a
// function of its own so that the signal handler is released by a deferred
// call that runs, which it would not in main before os.Exit.
func runUntilSignalled(ctx context.Context, o options) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, o)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, o options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig %q: %w", o.kubeconfig, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerRESTMetrics(reg)
	cfg.QPS, cfg.Burst = o.qps, o.burst
	cfg.UserAgent = "gpulink-controller"
	if err := kubeclient.SetContentType(cfg, o.contentType); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}

	metrics := controller.NewMetrics(reg)
	recorder, stopRecorder := controller.NewRecorder(ctx, client)
	defer stopRecorder()

	if o.planWorkers < 0 {
		return fmt.Errorf("--plan-workers=%d: want 0 (one per CPU) or more", o.planWorkers)
	}
	hierarchy, err := gang.NewHierarchyFromKeys(o.gangHierarchy)
	if err != nil {
		return fmt.Errorf("--gang-hierarchy: %w", err)
	}
	podGroups := o.gangPodGroups == "true"
	switch o.gangPodGroups {
	case "true", "false":
	case "auto":
		if podGroups, err = controller.PodGroupsServed(client.Discovery()); err != nil {
			return fmt.Errorf("--gang-podgroups=auto: %w", err)
		}
	default:
		return fmt.Errorf("--gang-podgroups=%q: want true, false or auto", o.gangPodGroups)
	}
	klog.FromContext(ctx).Info("Gangs", "hierarchy", o.gangHierarchy, "podGroups", podGroups, "starvationBound", o.gangStarvation, "preferredStarvationBound", o.gangPreferredStarv, "strictReservationBound", o.gangStrictReserve)

	ctrl, err := controller.New(controller.Config{
		Client:             client,
		Recorder:           recorder,
		Metrics:            metrics,
		Policy:             allocate.Policy{Node: allocate.Strategy(o.nodePacking), GPU: allocate.Strategy(o.gpuPacking)},
		Workers:            o.workers,
		PlanWorkers:        o.planWorkers,
		ResyncPeriod:       o.resyncPeriod,
		UnschedulableGrace: o.unschedulableGrace,
		DeviceTaintRules:   o.deviceTaintRules,
		Mix:                planner.MixConfig{Window: o.mixWindow, Refresh: o.mixRefresh},
		RankByStranding:    o.rankByStranding,
		PlaceCPUPods:       o.placeCPUPods,
		SteerCPUPods:       o.steerCPUPods,
		SteerScarceNodes:   o.steerScarceNodes,
		HoldNamespace:      o.holdNamespace,
		Gangs: controller.GangConfig{Hierarchy: hierarchy, PodGroups: podGroups, DefaultLevel: o.gangDefaultLevel,
			DefaultPolicy: gangs.Policy(o.gangDefaultPolicy), StarvationBound: o.gangStarvation,
			PreferredStarvationBound: o.gangPreferredStarv, StrictReservationBound: o.gangStrictReserve, RailAttribute: o.gangRailAttribute},
	})
	if err != nil {
		return err
	}

	var compatOpts *admission.Options
	if o.webhookAddress != "" {
		cc, err := compat.Load(o.compatConfig)
		if err != nil {
			return err
		}
		if o.compatGrace <= 0 {
			return fmt.Errorf("--compat-template-grace %s must be positive", o.compatGrace)
		}
		if err := o.webhookLimits.Validate(); err != nil {
			return fmt.Errorf("--webhook-max-body-bytes and --webhook-max-buffered-bytes: %w", err)
		}
		compatOpts = &admission.Options{
			Address: o.webhookAddress, ReusePort: o.webhookReusePort, CertDir: o.webhookCertDir, Limits: o.webhookLimits, Config: cc,
			Grace: o.compatGrace, Metrics: reg, Recorder: recorder,
		}
	}

	var leading atomic.Bool
	watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	run := func(name, addr string, h http.Handler) {
		if addr == "" {
			return
		}
		wg.Go(func() {
			if err := serve.Serve(ctx, addr, h, serve.Options{Name: name}); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	if compatOpts != nil {
		wg.Go(func() {
			if err := admission.Serve(ctx, client, *compatOpts); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	run("metrics", o.metricsAddress, serve.Metrics(reg, o.profiling))
	run("health", o.healthAddress, serve.Health(watchdog.Check, func() bool { return !leading.Load() || ctrl.Ready() }))

	lead := func(ctx context.Context) {
		leading.Store(true)
		if compatOpts != nil {
			wg.Go(func() {
				if err := admission.Lead(ctx, client, *compatOpts); err != nil {
					errs <- err
					cancel()
				}
			})
		}
		if err := ctrl.Run(ctx); err != nil {
			errs <- err
		}
		cancel()
	}
	if o.leaderElect {
		if err := controller.RunLeading(ctx, client, controller.LeaderElection{
			Namespace: o.leaseNamespace, Name: o.leaseName,
			LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod,
			Watchdog: watchdog,
		}, lead); err != nil {
			cancel()
			wg.Wait()
			return err
		}
	} else {
		lead(ctx)
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

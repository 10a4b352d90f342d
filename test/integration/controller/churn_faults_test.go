//go:build integration

package controller_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// TestChurnSharedClaimsFaultsAndDelegation runs churn with everything that
// can make two decisions meet: four workers, pods sharing standalone
// claims, pods with two claims, a fraction of the controller's writes to
// claims and pods failing (HTTP 429, conflicts, timeouts after the write
// was applied, reported up to 300 ms later), and requests that tolerate
// the managed taint mixed in. Those
// are gated, as the chart's admission policy gates every pod with claims,
// so the controller allocates them: one allocator. (An ungated tolerating
// pod is kube-scheduler's, whose in-flight decisions the controller cannot
// see; an earlier version of this test mixed such pods in and saw
// kube-scheduler give shares of a GPU the controller was giving out whole
// in the same second. controller/doc.go documents that residual, which
// with the admission policy exists only after kube-scheduler refused a
// pod on its node, and the kubelet plugin's conflict check catches it;
// TestSchedulerCountsControllerAllocations covers kube-scheduler's
// allocations one at a time.) Throughout: no GPU held whole twice or
// whole and shared, shares within memory and cores, allocations on their
// node, bound pods on the node of all their claims, and no claim
// allocated by kube-scheduler. At the end nothing is left: claims
// from templates are gone, standalone claims are neither allocated nor
// reserved nor carry the finalizer.
//
// It runs twice: steady, and under load (goroutines spinning on every CPU
// for at most 90 s), which slows the controller, the API server and
// kube-scheduler unevenly, as a busy CI machine does: a race between the
// controller's writes and kube-scheduler's binding (issue 33: a timed-out
// write that had landed was rolled back under a pod kube-scheduler had
// just bound) showed up only that way.
//
// GPULINK_CHURN_PODS overrides the number of pods of the steady run
// (default 200), GPULINK_CHURN_LOAD_PODS that of the run under load
// (default 120), GPULINK_CHURN_LOAD its spinning goroutines (default: one
// per CPU). GPULINK_CHURN_SEED replays a run's draws (churnSeed); the
// run under load draws from the seed plus one.
func TestChurnSharedClaimsFaultsAndDelegation(t *testing.T) {
	seed := churnSeed(t)
	t.Run("steady", func(t *testing.T) {
		faultChurn(t, faultChurnOptions{seed: seed, pods: envInt("GPULINK_CHURN_PODS", 200), nodePrefix: "fault"})
	})
	t.Run("under-load", func(t *testing.T) {
		faultChurn(t, faultChurnOptions{seed: seed + 1, pods: envInt("GPULINK_CHURN_LOAD_PODS", 120), nodePrefix: "load",
			burners: envInt("GPULINK_CHURN_LOAD", runtime.NumCPU()), maxChurn: 90 * time.Second})
	})
}

// faultChurnOptions configures one run of faultChurn.
type faultChurnOptions struct {
	seed uint64
	// pods is the number of pods to create.
	pods int
	// nodePrefix names the run's nodes.
	nodePrefix string
	// burners spin on the CPUs during the churn, for at most maxChurn;
	// pods stop being created after maxChurn (0: no limit).
	burners  int
	maxChurn time.Duration
}

// faultChurn is one run of TestChurnSharedClaimsFaultsAndDelegation.
func faultChurn(t *testing.T, o faultChurnOptions) {
	rng := rand.New(rand.NewPCG(o.seed, 0))
	total := o.pods
	const maxLive = 30
	e := setup(t, map[string]string{
		o.nodePrefix + "-v100": "v100-sxm2-8-aliyun-sccgn6.txt",
		o.nodePrefix + "-p40":  "p40-pcie-7.txt",
		o.nodePrefix + "-a100": "dgx-a100.txt",
	})
	tolerate := []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	tolOne := controllertest.WholeRequest("g", 1)
	tolOne.Exactly.Tolerations = tolerate
	tolShare := controllertest.ShareRequest("s", "2Gi", "20")
	tolShare.Exactly.Tolerations = tolerate
	templates := map[string]resourceapi.DeviceClaim{
		"one":       {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}},
		"two":       {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}},
		"four":      {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}},
		"share-s":   {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}},
		"share-l":   {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "8Gi", "60")}},
		"tol-one":   {Requests: []resourceapi.DeviceRequest{tolOne}},
		"tol-share": {Requests: []resourceapi.DeviceRequest{tolShare}},
	}
	for n, spec := range templates {
		e.template(n, spec)
	}
	// Standalone claims, each used by several pods at once.
	shared := []string{"shared-one-0", "shared-one-1", "shared-two", "shared-share-0", "shared-share-1"}
	sharedSpec := map[string]resourceapi.DeviceClaim{
		"shared-one-0":   templates["one"],
		"shared-one-1":   templates["one"],
		"shared-two":     templates["two"],
		"shared-share-0": templates["share-s"],
		"shared-share-1": {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "40")}},
	}
	for _, name := range shared {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: resourceapi.ResourceClaimSpec{Devices: sharedSpec[name]}}
		if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Claims get gpulink's finalizer from the chart's admission policy
	// here (two writes per allocation); TestChurnWithRestarts runs
	// without it (the controller adds the finalizer).
	e.installClaimFinalizerPolicy()

	faults := newFaultyTransport(o.seed, 4, 3, 3, 300*time.Millisecond)
	ctrl := e.startControllerWith(4, faults.wrap)

	var violation atomic.Value
	stopCheck := make(chan struct{})
	var checker sync.WaitGroup
	var checks atomic.Int32
	var byScheduler sync.Map // claims kube-scheduler allocated
	checker.Go(func() {
		for {
			select {
			case <-stopCheck:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if err := e.checkInvariants(); err != nil && violation.Load() == nil {
				violation.Store(err.Error() + "\nclaims then:\n" + e.describeClaims())
			}
			for _, name := range e.allocatedByScheduler() {
				byScheduler.Store(name, true)
			}
			checks.Add(1)
		}
	})

	// newPod picks a kind of pod at random.
	kinds := map[string]int{}
	newPod := func(name string) *corev1.Pod {
		n := rng.IntN(100)
		var p *corev1.Pod
		var kind string
		switch {
		case n < 25:
			kind = "single"
			tpl := []string{"one", "two", "four", "share-s", "share-l"}[rng.IntN(5)]
			p = e.newPod(name, true, tpl)
		case n < 45:
			kind = "two-claims"
			a := []string{"one", "two", "share-s"}[rng.IntN(3)]
			b := []string{"one", "share-s", "share-l"}[rng.IntN(3)]
			p = e.newPod(name, true, a, b)
		case n < 70:
			kind = "shared"
			p = e.newPod(name, rng.IntN(5) != 0)
			useClaim(p, "shared", shared[rng.IntN(len(shared))])
			if rng.IntN(3) == 0 {
				p2 := e.newPod(name, false, "share-s")
				p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, p2.Spec.ResourceClaims...)
				p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, p2.Spec.Containers[0].Resources.Claims...)
			}
		case n < 85:
			kind = "tolerating"
			p = e.newPod(name, true, []string{"tol-one", "tol-share"}[rng.IntN(2)])
		default:
			kind = "tolerating-two-claims"
			p = e.newPod(name, true, []string{"tol-one", "tol-share"}[rng.IntN(2)], []string{"one", "share-s"}[rng.IntN(2)])
		}
		kinds[kind]++
		// The kind in the name makes violations readable.
		p.Name = name + "-" + kind
		return p
	}

	cp := newChurnPods()
	var created int
	start := time.Now()
	stopBurn := func() {}
	if o.burners > 0 {
		stopBurn = burnCPU(o.burners, o.maxChurn)
		defer stopBurn()
		t.Logf("load: %d goroutines spinning for at most %s", o.burners, o.maxChurn)
	}
	for created < total || len(cp.live) > 0 {
		if o.maxChurn > 0 && time.Since(start) > o.maxChurn && created < total {
			t.Logf("churn time limit %s reached after %d of %d pods", o.maxChurn, created, total)
			total = created
		}
		now := time.Now()
		cp.sweep(t, e, now)
		for created < total && len(cp.live) < maxLive {
			name := e.createPod(newPod(fmt.Sprintf("f%04d", created))).Name
			cp.live[name] = &livePod{created: now,
				boundLife: time.Duration(rng.IntN(2000)) * time.Millisecond,
				maxWait:   time.Duration(3000+rng.IntN(8000)) * time.Millisecond}
			created++
		}
		time.Sleep(100 * time.Millisecond)
	}
	churn := time.Since(start)
	stopBurn()

	// Nothing may leak: claims from templates are deleted with their
	// pods; standalone claims are released once no pod uses them.
	e.poll("all claims released", 3*time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, c := range l.Items {
			if !slices.Contains(shared, c.Name) || c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 || len(c.Finalizers) > 0 {
				return false
			}
		}
		return true
	})
	ctrl.stop()
	close(stopCheck)
	checker.Wait()
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
	if v := violation.Load(); v != nil {
		t.Errorf("invariant violated during churn: %s", v)
	}
	t.Logf("churn with faults: %d pods %v (%d bound, %d deleted while pending) in %s; injected %s; %d invariant checks",
		created, kinds, cp.bound, cp.deletedPending, churn.Round(time.Millisecond), faults, checks.Load())
	if cp.bound == 0 {
		t.Error("no pod was ever bound")
	}
	// Every pod is gated, so the controller allocates every claim and
	// hands a pod over only with all its claims allocated. A claim
	// kube-scheduler allocated (a tolerating one, which it may) means a
	// pod was handed over with one unallocated: the defect that let it
	// over-commit a GPU's shares in a CI run of 2026-11-30, found here even when
	// kube-scheduler's choice happens not to collide.
	var scheduled []string
	byScheduler.Range(func(k, _ any) bool {
		scheduled = append(scheduled, k.(string))
		return true
	})
	if len(scheduled) > 0 {
		slices.Sort(scheduled)
		t.Errorf("kube-scheduler allocated %d claims of gated pods: %v", len(scheduled), scheduled)
	}
	if faults.injected429.Load()+faults.injected409.Load()+faults.injectedTimeout.Load() == 0 {
		t.Error("no fault was injected")
	}
}

// allocatedByScheduler returns the allocated claims of the namespace that
// carry kube-scheduler's finalizer, which it adds to the claims it
// allocates and the controller never adds.
func (e *env) allocatedByScheduler() []string {
	l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, c := range l.Items {
		if c.Status.Allocation != nil && slices.Contains(c.Finalizers, resourceapi.Finalizer) {
			out = append(out, c.Name)
		}
	}
	return out
}

// useClaim makes the pod use an existing claim by name.
func useClaim(p *corev1.Pod, ref, claim string) {
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: ref, ResourceClaimName: &claim})
	p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: ref})
}

// describeClaims renders the allocated claims of the namespace, for
// diagnosing an invariant violation.
func (e *env) describeClaims() string {
	l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, c := range l.Items {
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		var devs, users []string
		for _, r := range a.Devices.Results {
			d := r.Device
			if r.ShareID != nil {
				d += "(share)"
			}
			devs = append(devs, d)
		}
		for _, r := range c.Status.ReservedFor {
			users = append(users, r.Name)
		}
		fmt.Fprintf(&b, "  %s on %s: %v reserved for %v, allocated %v, finalizers %v, deleting %v\n", c.Name, nodeOf(&c), devs, users, a.AllocationTimestamp, c.Finalizers, c.DeletionTimestamp != nil)
	}
	return b.String()
}

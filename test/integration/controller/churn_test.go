//go:build integration

package controller_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
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

// TestChurnWithRestarts creates and deletes pods of random sizes and
// shares at random across four nodes while the controller is stopped and
// restarted at random moments (cancelling whatever API call is in flight).
// An invariant checker runs over all claims throughout: no device is given
// out twice, shares never exceed a GPU, allocations sit on their node.
// Every bound pod must be on the node its claims were allocated on. After
// the last pod is gone no claim may remain (nothing leaks).
//
// GPULINK_CHURN_PODS overrides the number of pods (default 500).
func TestChurnWithRestarts(t *testing.T) {
	total := 500
	if v, err := strconv.Atoi(os.Getenv("GPULINK_CHURN_PODS")); err == nil && v > 0 {
		total = v
	}
	const maxLive = 40
	e := setup(t, map[string]string{
		"churn-v100-1": "v100-sxm2-8-aliyun-sccgn6.txt",
		"churn-v100-2": "v100-sxm2-8-aliyun-sccgn6.txt",
		"churn-p40":    "p40-pcie-7.txt",
		"churn-a100":   "dgx-a100.txt",
	})
	templates := map[string]resourceapi.DeviceClaim{
		"one":         {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}},
		"two":         {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}},
		"four":        {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}},
		"eight":       {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}},
		"four-nvlink": {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}, Config: []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()}},
		"share-s":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}},
		"share-m":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "25")}},
		"share-l":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "12Gi", "50")}},
		"share-dflt":  {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "", "")}},
	}
	for n, spec := range templates {
		e.template(n, spec)
	}
	// Small requests are more common than large ones.
	weights := map[string]int{"one": 4, "two": 3, "four": 1, "eight": 1, "four-nvlink": 1, "share-s": 3, "share-m": 3, "share-l": 2, "share-dflt": 2}
	var names []string
	for n, w := range weights {
		for range w {
			names = append(names, n)
		}
	}

	// The controller, restarted at random moments.
	var mu sync.Mutex
	cur := e.startController(4)
	stopRestarts := make(chan struct{})
	var restarts atomic.Int32
	var restarter sync.WaitGroup
	restarter.Go(func() {
		for {
			select {
			case <-stopRestarts:
				return
			case <-time.After(time.Duration(1500+rand.IntN(4500)) * time.Millisecond):
			}
			mu.Lock()
			cur.stop()
			time.Sleep(time.Duration(rand.IntN(500)) * time.Millisecond)
			cur = e.startController(4)
			mu.Unlock()
			restarts.Add(1)
		}
	})

	// The invariant checker.
	var violation atomic.Value
	stopCheck := make(chan struct{})
	var checker sync.WaitGroup
	var checks atomic.Int32
	checker.Go(func() {
		for {
			select {
			case <-stopCheck:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if err := e.checkInvariants(); err != nil && violation.Load() == nil {
				violation.Store(err.Error())
			}
			checks.Add(1)
		}
	})

	// A pod lives a random time after it is bound, or is deleted while
	// still pending after a random longer time (kube-controller-manager
	// creates the claims from templates at its own pace).
	type livePod struct {
		name      string
		created   time.Time
		boundLife time.Duration
		maxWait   time.Duration
	}
	live := map[string]*livePod{}
	var bound, created, deletedPending int
	start := time.Now()
	checkBound := func(p *corev1.Pod) {
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName == nil {
				continue
			}
			c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				continue
			}
			if c.Status.Allocation == nil || nodeOf(c) != p.Spec.NodeName {
				t.Errorf("pod %s bound to %s but its claim %s is allocated on %q", p.Name, p.Spec.NodeName, c.Name, nodeOf(c))
			}
		}
	}
	boundAt := map[string]time.Time{}
	for created < total || len(live) > 0 {
		now := time.Now()
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if _, ok := live[p.Name]; ok && p.Spec.NodeName != "" && boundAt[p.Name].IsZero() {
				boundAt[p.Name] = now
				bound++
				checkBound(p)
			}
		}
		for name, lp := range live {
			b := boundAt[name]
			switch {
			case !b.IsZero() && now.Sub(b) > lp.boundLife:
			case b.IsZero() && now.Sub(lp.created) > lp.maxWait:
				deletedPending++
			default:
				continue
			}
			e.deletePod(name)
			delete(live, name)
		}
		for created < total && len(live) < maxLive {
			name := fmt.Sprintf("p%04d", created)
			tpl := names[rand.IntN(len(names))]
			e.createPod(e.newPod(name, rand.IntN(5) != 0, tpl))
			live[name] = &livePod{name: name, created: now,
				boundLife: time.Duration(rand.IntN(1500)) * time.Millisecond,
				maxWait:   time.Duration(2000+rand.IntN(8000)) * time.Millisecond}
			created++
		}
		time.Sleep(100 * time.Millisecond)
	}
	churn := time.Since(start)

	close(stopRestarts)
	restarter.Wait()
	// Nothing may leak: every claim is released and deleted once its pod is gone.
	mu.Lock()
	e.poll("all claims released and deleted", 3*time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	cur.stop()
	mu.Unlock()
	close(stopCheck)
	checker.Wait()
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
	if v := violation.Load(); v != nil {
		t.Errorf("invariant violated during churn: %s", v)
	}
	t.Logf("churn: %d pods (%d bound, %d deleted while pending) in %s, %d controller restarts, %d invariant checks",
		created, bound, deletedPending, churn.Round(time.Millisecond), restarts.Load(), checks.Load())
	if bound == 0 {
		t.Error("no pod was ever bound")
	}
}

// TestChurnSharedClaimsFaultsAndDelegation runs churn with everything that
// can make two decisions meet: four workers, pods sharing standalone
// claims, pods with two claims, a fraction of the controller's writes to
// claims and pods failing (HTTP 429, conflicts, timeouts after the write
// was sent), and requests that tolerate the managed taint mixed in. Those
// are gated, as the chart's admission policy gates every pod with claims,
// so the controller allocates them: one allocator. (An ungated tolerating
// pod is kube-scheduler's, whose in-flight decisions the controller cannot
// see; an earlier version of this test mixed such pods in and saw
// kube-scheduler give shares of a GPU the controller was giving out whole
// in the same second. controller/doc.go documents that residual, which
// only exists without the admission policy, and the kubelet plugin's
// conflict check catches it; TestSchedulerCountsControllerAllocations
// covers kube-scheduler's allocations one at a time.) Throughout: no GPU held whole twice or whole and shared,
// shares within memory and cores, allocations on their node, bound pods
// on the node of all their claims. At the end nothing is left: claims
// from templates are gone, standalone claims are neither allocated nor
// reserved nor carry the finalizer.
//
// GPULINK_CHURN_PODS overrides the number of pods (default 200).
func TestChurnSharedClaimsFaultsAndDelegation(t *testing.T) {
	total := 200
	if v, err := strconv.Atoi(os.Getenv("GPULINK_CHURN_PODS")); err == nil && v > 0 {
		total = v
	}
	const maxLive = 30
	e := setup(t, map[string]string{
		"fault-v100": "v100-sxm2-8-aliyun-sccgn6.txt",
		"fault-p40":  "p40-pcie-7.txt",
		"fault-a100": "dgx-a100.txt",
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

	faults := &faultyTransport{tooMany: 4, conflict: 3, timeout: 3}
	ctrl := e.startControllerWith(4, faults.wrap)

	var violation atomic.Value
	stopCheck := make(chan struct{})
	var checker sync.WaitGroup
	var checks atomic.Int32
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
			checks.Add(1)
		}
	})

	// newPod picks a kind of pod at random.
	kinds := map[string]int{}
	newPod := func(name string) *corev1.Pod {
		n := rand.IntN(100)
		var p *corev1.Pod
		var kind string
		switch {
		case n < 25:
			kind = "single"
			tpl := []string{"one", "two", "four", "share-s", "share-l"}[rand.IntN(5)]
			p = e.newPod(name, true, tpl)
		case n < 45:
			kind = "two-claims"
			a := []string{"one", "two", "share-s"}[rand.IntN(3)]
			b := []string{"one", "share-s", "share-l"}[rand.IntN(3)]
			p = e.newPod(name, true, a, b)
		case n < 70:
			kind = "shared"
			p = e.newPod(name, rand.IntN(5) != 0)
			useClaim(p, "shared", shared[rand.IntN(len(shared))])
			if rand.IntN(3) == 0 {
				p2 := e.newPod(name, false, "share-s")
				p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, p2.Spec.ResourceClaims...)
				p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, p2.Spec.Containers[0].Resources.Claims...)
			}
		case n < 85:
			kind = "tolerating"
			p = e.newPod(name, true, []string{"tol-one", "tol-share"}[rand.IntN(2)])
		default:
			kind = "tolerating-two-claims"
			p = e.newPod(name, true, []string{"tol-one", "tol-share"}[rand.IntN(2)], []string{"one", "share-s"}[rand.IntN(2)])
		}
		kinds[kind]++
		// The kind in the name makes violations readable.
		p.Name = name + "-" + kind
		return p
	}
	checkBound := func(p *corev1.Pod) {
		var names []string
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				names = append(names, *s.ResourceClaimName)
			}
		}
		for _, pc := range p.Spec.ResourceClaims {
			if pc.ResourceClaimName != nil {
				names = append(names, *pc.ResourceClaimName)
			}
		}
		for _, name := range names {
			c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			if c.Status.Allocation == nil || nodeOf(c) != p.Spec.NodeName {
				t.Errorf("pod %s bound to %s but its claim %s is allocated on %q", p.Name, p.Spec.NodeName, c.Name, nodeOf(c))
			}
		}
	}

	type livePod struct {
		created   time.Time
		boundLife time.Duration
		maxWait   time.Duration
	}
	live := map[string]*livePod{}
	boundAt := map[string]time.Time{}
	var bound, created, deletedPending int
	start := time.Now()
	for created < total || len(live) > 0 {
		now := time.Now()
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if _, ok := live[p.Name]; ok && p.Spec.NodeName != "" && boundAt[p.Name].IsZero() {
				boundAt[p.Name] = now
				bound++
				checkBound(p)
			}
		}
		for name, lp := range live {
			b := boundAt[name]
			switch {
			case !b.IsZero() && now.Sub(b) > lp.boundLife:
			case b.IsZero() && now.Sub(lp.created) > lp.maxWait:
				deletedPending++
			default:
				continue
			}
			e.deletePod(name)
			delete(live, name)
		}
		for created < total && len(live) < maxLive {
			name := e.createPod(newPod(fmt.Sprintf("f%04d", created))).Name
			live[name] = &livePod{created: now,
				boundLife: time.Duration(rand.IntN(2000)) * time.Millisecond,
				maxWait:   time.Duration(3000+rand.IntN(8000)) * time.Millisecond}
			created++
		}
		time.Sleep(100 * time.Millisecond)
	}
	churn := time.Since(start)

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
		created, kinds, bound, deletedPending, churn.Round(time.Millisecond), faults, checks.Load())
	if bound == 0 {
		t.Error("no pod was ever bound")
	}
	if faults.injected429.Load()+faults.injected409.Load()+faults.injectedTimeout.Load() == 0 {
		t.Error("no fault was injected")
	}
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

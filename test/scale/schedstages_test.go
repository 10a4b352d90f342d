//go:build integration

package scale_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Stages a pod passes through on its way to a node, as the benchmark's
// own informers first see them. The stock path has no gate to lift.
const (
	stageClaimCreated = "claim created"   // kube-controller-manager made it from the template
	stageAllocated    = "claim allocated" // kube-scheduler's PreBind or gpulink's controller wrote it
	stageUngated      = "gate lifted"     // gpulink's controller removed its scheduling gate
	stageBound        = "bound"           // kube-scheduler bound the pod
)

var stageOrder = []string{stageClaimCreated, stageAllocated, stageUngated, stageBound}

// stageWatch records when each pod of the namespace first reaches each
// stage, so that create→bound can be split into the steps that make it.
type stageWatch struct {
	mu sync.Mutex
	at map[string]map[string]time.Time // pod -> stage -> first seen
	// gated are the pods seen with gpulink's gate: only theirs is lifted.
	gated map[string]bool
}

func newStageWatch(t *testing.T, e *env) *stageWatch {
	t.Helper()
	w := &stageWatch{at: map[string]map[string]time.Time{}, gated: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(e.client, 0, informers.WithNamespace(e.ns))
	pods := factory.Core().V1().Pods().Informer()
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		w.mu.Lock()
		wasGated := w.gated[p.Name]
		if gated(p) {
			w.gated[p.Name] = true
		}
		w.mu.Unlock()
		if wasGated && !gated(p) {
			w.seen(p.Name, stageUngated)
		}
		if p.Spec.NodeName != "" {
			w.seen(p.Name, stageBound)
		}
	}
	claims := factory.Resource().V1().ResourceClaims().Informer()
	onClaim := func(obj any) {
		c, ok := obj.(*resourceapi.ResourceClaim)
		if !ok {
			return
		}
		for _, o := range c.OwnerReferences {
			if o.Kind != "Pod" {
				continue
			}
			w.seen(o.Name, stageClaimCreated)
			if c.Status.Allocation != nil {
				w.seen(o.Name, stageAllocated)
			}
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		on  func(any)
	}{{pods, onPod}, {claims, onClaim}} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: h.on, UpdateFunc: func(_, n any) { h.on(n) }}); err != nil {
			t.Fatal(err)
		}
	}
	factory.Start(e.ctx.Done())
	factory.WaitForCacheSync(e.ctx.Done())
	return w
}

func (w *stageWatch) seen(pod, stage string) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.at[pod]
	if m == nil {
		m = map[string]time.Time{}
		w.at[pod] = m
	}
	if _, ok := m[stage]; !ok {
		m[stage] = now
	}
}

func (w *stageWatch) stage(pod, stage string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.at[pod][stage]
	return at, ok
}

func (w *stageWatch) boundAt(pod string) (time.Time, bool) { return w.stage(pod, stageBound) }

func (w *stageWatch) countBound(pods []string) int {
	n := 0
	for _, p := range pods {
		if _, ok := w.boundAt(p); ok {
			n++
		}
	}
	return n
}

// breakdown returns, per stage, the p50 in milliseconds of the time from
// each pod's creation to that stage, for the stages the pods went
// through (the stock path's pods are never gated).
func (w *stageWatch) breakdown(created map[string]time.Time) map[string]float64 {
	out := map[string]float64{}
	for _, st := range stageOrder {
		var d []time.Duration
		for pod, c := range created {
			if at, ok := w.stage(pod, st); ok {
				d = append(d, max(at.Sub(c), 0))
			}
		}
		if len(d) > 0 {
			out[st] = percentileMs(d, 0.50)
		}
	}
	return out
}

// processCPU reads the CPU time (user + system, seconds) of the cluster's
// processes (every process with the cluster's directory in its command
// line: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// gpulink's controller) and of this test, by program name.
func processCPU(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Logf("no /proc: %v", err)
		return nil
	}
	self := os.Getpid()
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		name := filepath.Base(args[0])
		if pid == self {
			name = "benchmark (this test)"
		} else if !strings.Contains(string(cmdline), cluster.Dir()) {
			continue
		}
		if s, ok := cpuSecondsOf(pid); ok {
			out[name] += s
		}
	}
	return out
}

// cpuSecondsOf reads a process's user + system CPU time from
// /proc/PID/stat.
func cpuSecondsOf(pid int) (float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	// The fields after the command name, which may hold spaces, in "(…)".
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (utime + stime) / 100, true // USER_HZ
}

// apiWrites reads the API server's apiserver_request_total and sums the
// writes (every verb but GET, LIST and WATCH) by "VERB resource[/sub]".
func apiWrites(t *testing.T, e *env) map[string]float64 {
	t.Helper()
	raw, err := e.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(e.ctx)
	if err != nil {
		t.Logf("no API server metrics: %v", err)
		return nil
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		l := sc.Text()
		series, ok := strings.CutPrefix(l, "apiserver_request_total{")
		if !ok {
			continue
		}
		verb := labelValue(series, "verb")
		switch verb {
		case "GET", "LIST", "WATCH", "":
			continue
		}
		key := verb + " " + labelValue(series, "resource")
		if sub := labelValue(series, "subresource"); sub != "" {
			key += "/" + sub
		}
		if v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
			out[key] += v
		}
	}
	return out
}

// perPod returns after − before per pod, keeping what changed.
func perPod(before, after map[string]float64, pods int, minPerPod float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := (v - before[k]) / float64(pods); d >= minPerPod {
			out[k] = d
		}
	}
	return out
}

package kubeletplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/health"
	"github.com/gpulink/gpulink/driver/topology"
)

// Event reasons on the Node.
const (
	ReasonGPUUnhealthy = "GPUUnhealthy"
	ReasonGPURecovered = "GPURecovered"
	ReasonGPUWarning   = "GPUWarning"
	actionHealth       = "HealthCheck"
)

// healthStateFile keeps the fatal conditions across plugin restarts (an
// XID is reported once; a restart must not forget it).
const healthStateFile = "health.json"

// HealthOptions configure device health handling; nil in Options turns it
// off (WatchHealthStatus answers "not supported", nothing is tainted).
type HealthOptions struct {
	// Policy classifies events; see package driver/health.
	Policy health.Policy
	// TaintEffect of driver.UnhealthyTaintKey: NoSchedule (default) keeps
	// new claims off the GPU, NoExecute also evicts the pods using it.
	TaintEffect resourceapi.DeviceTaintEffect
	// ResendInterval is how often the kubelet gets a health report when
	// nothing changed (default 20s); reports are valid for three times it.
	ResendInterval time.Duration
}

// HealthSource watches GPUs and reports what it sees.
type HealthSource interface {
	// Name identifies the source in logs and in the liveness error.
	Name() string
	// Run reports events until ctx ends. An error means the source can no
	// longer see the GPUs at all: the plugin's liveness check fails and
	// the kubelet is told their health is unknown.
	Run(ctx context.Context, sink HealthSink) error
}

// HealthSink receives a source's observations.
type HealthSink interface {
	// Report hands over one event; Device or UUID names the GPU.
	Report(e health.Event)
	// SourceFailing says the source cannot read the GPUs now (err != nil)
	// or can again (nil).
	SourceFailing(err error)
}

// healthMonitor is the Driver's health state.
type healthMonitor struct {
	opts     HealthOptions
	recorder events.EventRecorder
	node     *corev1.ObjectReference
	path     string

	mu      sync.Mutex
	tracker *health.Tracker
	failing map[string]error
	// changed is closed and replaced whenever a report would differ.
	changed chan struct{}
	bootID  string
}

type persistedHealth struct {
	BootID  string                          `json:"bootID"`
	Devices map[string]map[string]time.Time `json:"devices"`
}

func (d *Driver) setupHealth(logger klog.Logger, opts *HealthOptions, recorder events.EventRecorder) error {
	if opts == nil {
		return nil
	}
	o := *opts
	switch o.TaintEffect {
	case "":
		o.TaintEffect = resourceapi.DeviceTaintEffectNoSchedule
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
	default:
		return fmt.Errorf("health taint effect %q: want %s or %s", o.TaintEffect, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute)
	}
	if err := o.Policy.Validate(); err != nil {
		return fmt.Errorf("health policy: %w", err)
	}
	if o.ResendInterval <= 0 {
		o.ResendInterval = 20 * time.Second
	}
	m := &healthMonitor{
		opts:     o,
		recorder: recorder,
		// kubelet's own node events use the node name as UID, and kubectl
		// describe node looks them up that way.
		node:    &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: d.opts.NodeName, UID: types.UID(d.opts.NodeName)},
		path:    filepath.Join(d.opts.PluginDataDir, healthStateFile),
		tracker: health.NewTracker(o.Policy),
		failing: map[string]error{},
		changed: make(chan struct{}),
	}
	bootID, err := d.bootID()
	if err != nil {
		return fmt.Errorf("reading boot ID for the health state: %w", err)
	}
	m.bootID = bootID
	data, err := os.ReadFile(m.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("reading health state: %w", err)
	default:
		var p persistedHealth
		if err := json.Unmarshal(data, &p); err != nil {
			// Losing the record only forgets taints, the GPUs' sources
			// report again what still holds; refusing to start would
			// take every GPU of the node away.
			logger.Error(err, "Health state is corrupt, starting with every GPU healthy", "path", m.path)
		} else if p.BootID != bootID {
			logger.Info("Node rebooted, GPU health conditions of the previous boot dropped", "path", m.path)
		} else {
			for dev, conds := range p.Devices {
				m.tracker.Restore(dev, conds)
				logger.Info("GPU still unhealthy from before the restart", "device", dev, "conditions", slices.Sorted(maps.Keys(conds)))
			}
		}
	}
	d.health = m
	d.refreshHealthGauges(d.topo)
	return nil
}

// refreshHealthGauges exports the health of every GPU of t (at start and
// when discovery finds other GPUs).
func (d *Driver) refreshHealthGauges(t *topology.Topology) {
	m := d.health
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range t.GPUs {
		name := driver.DeviceName(g.Index)
		d.setHealthGauge(name, g.UUID, m.tracker.State(name).Healthy())
	}
}

func (d *Driver) setHealthGauge(device, uuid string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	d.metrics.DeviceHealthy.WithLabelValues(device, uuid).Set(v)
}

// persist writes the conditions; called with m.mu held.
func (m *healthMonitor) persist() error {
	p := persistedHealth{BootID: m.bootID, Devices: map[string]map[string]time.Time{}}
	for dev, st := range m.tracker.Unhealthy() {
		p.Devices[dev] = st.Conditions
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tmp := m.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing health state: %w", err)
	}
	if err := os.Rename(tmp, m.path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing health state: %w", err)
	}
	return nil
}

// notify wakes the health watchers; called with m.mu held.
func (m *healthMonitor) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// healthSink is what one source reports to.
type healthSink struct {
	d      *Driver
	ctx    context.Context
	source string
}

func (s healthSink) Report(e health.Event) { s.d.HandleHealthEvent(s.ctx, e) }

func (s healthSink) SourceFailing(err error) { s.d.setSourceFailing(s.ctx, s.source, err) }

func (d *Driver) setSourceFailing(ctx context.Context, source string, err error) {
	m := d.health
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, was := m.failing[source]
	switch {
	case err == nil && was:
		delete(m.failing, source)
		klog.FromContext(ctx).Info("GPU health source works again", "source", source)
	case err != nil && (!was || old.Error() != err.Error()):
		m.failing[source] = err
		klog.FromContext(ctx).Error(err, "GPU health source cannot read the GPUs", "source", source)
	default:
		return
	}
	m.notify()
}

// HealthError is nil while every health source can read the GPUs; the
// plugin's liveness endpoint fails with it otherwise, so a node whose
// NVML broke restarts the plugin instead of showing every GPU healthy.
func (d *Driver) HealthError() error {
	m := d.health
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, s := range slices.Sorted(maps.Keys(m.failing)) {
		errs = append(errs, fmt.Errorf("health source %s: %w", s, m.failing[s]))
	}
	return errors.Join(errs...)
}

// resolveGPU fills in the device name or UUID of e from the current
// topology; false when the GPU is not on this node.
func (d *Driver) resolveGPU(e *health.Event) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.topo.GPUs {
		name := driver.DeviceName(g.Index)
		if (e.Device != "" && e.Device == name) || (e.Device == "" && e.UUID != "" && e.UUID == g.UUID) {
			e.Device, e.UUID = name, g.UUID
			return true
		}
	}
	return false
}

// HandleHealthEvent applies one event: classify it, update the GPU's
// conditions, and on a change taint or untaint the device (republishing
// the slices), tell the kubelet, record an event on the Node and log.
func (d *Driver) HandleHealthEvent(ctx context.Context, e health.Event) {
	logger := klog.FromContext(ctx)
	m := d.health
	if m == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = d.clock.Now()
	}
	if !d.resolveGPU(&e) {
		logger.Error(nil, "Health event for a GPU this node does not have, ignored", "device", e.Device, "uuid", e.UUID, "kind", e.Kind)
		return
	}
	m.mu.Lock()
	verdict, transition := m.tracker.Apply(e)
	state := m.tracker.State(e.Device)
	if transition != health.Unchanged {
		if err := m.persist(); err != nil {
			logger.Error(err, "Persisting GPU health failed; the condition holds until the plugin restarts")
		}
		m.notify()
	}
	m.mu.Unlock()

	if verdict != health.Recovered || transition != health.Unchanged {
		d.metrics.HealthEvents.WithLabelValues(e.Device, string(verdict)).Inc()
	}
	d.setHealthGauge(e.Device, e.UUID, state.Healthy())
	kv := []any{"device", e.Device, "uuid", e.UUID, "kind", e.Kind, "verdict", verdict, "transition", transition}
	if e.Kind == health.KindXID {
		kv = append(kv, "xid", e.XID)
	}
	if e.Message != "" {
		kv = append(kv, "message", e.Message)
	}
	reason, _ := state.Reason()
	taint := fmt.Sprintf("%s=%s:%s", driver.UnhealthyTaintKey, reason, m.opts.TaintEffect)
	switch {
	case transition == health.BecameUnhealthy || (transition == health.StillUnhealthy && verdict == health.Fatal):
		logger.Error(nil, "GPU unhealthy, tainting it", append(kv, "taint", taint)...)
		d.recordEvent(e.Device, corev1.EventTypeWarning, ReasonGPUUnhealthy, "GPU %s (%s) is unhealthy: %s%s; device tainted %s", e.Device, e.UUID, e.FatalCondition(), detail(e.Message), taint)
	case transition == health.StillUnhealthy:
		logger.Info("GPU condition cleared, still unhealthy", append(kv, "taint", taint)...)
	case transition == health.BecameHealthy:
		logger.Info("GPU healthy again, taint removed", kv...)
		d.recordEvent(e.Device, corev1.EventTypeNormal, ReasonGPURecovered, "GPU %s (%s) is healthy again%s; taint %s removed", e.Device, e.UUID, detail(e.Message), driver.UnhealthyTaintKey)
	case verdict == health.Warning:
		logger.Info("GPU warning", kv...)
		what := string(e.Kind)
		if e.Kind == health.KindXID {
			what = e.FatalCondition()
		}
		d.recordEvent(e.Device, corev1.EventTypeWarning, ReasonGPUWarning, "GPU %s (%s): %s%s (not tainted)", e.Device, e.UUID, what, detail(e.Message))
	default:
		logger.V(2).Info("GPU health event", kv...)
	}
	if transition != health.Unchanged {
		d.requestRepublish()
	}
}

func detail(msg string) string {
	if msg == "" {
		return ""
	}
	return " (" + msg + ")"
}

// recordEvent records an event about device on the Node. The action names
// the device because client-go's event broadcaster folds events with the
// same regarding object, reason and action into one series that keeps the
// first note: without it, seven GPUs failing at once would show as one
// event naming only the first GPU.
func (d *Driver) recordEvent(device, eventType, reason, note string, args ...any) {
	if d.health.recorder == nil {
		return
	}
	d.health.recorder.Eventf(d.health.node, nil, eventType, reason, actionHealth+" "+device, note, args...)
}

// requestRepublish asks RunPublisher to publish the slices again.
func (d *Driver) requestRepublish() {
	select {
	case d.republish <- struct{}{}:
	default:
	}
}

// applyHealthTaints adds the unhealthy taint to the devices of res with a
// fatal condition.
func (d *Driver) applyHealthTaints(res *resourceslice.DriverResources) {
	m := d.health
	if m == nil {
		return
	}
	m.mu.Lock()
	unhealthy := m.tracker.Unhealthy()
	m.mu.Unlock()
	if len(unhealthy) == 0 {
		return
	}
	for name, pool := range res.Pools {
		for si := range pool.Slices {
			devs := pool.Slices[si].Devices
			for di := range devs {
				st, ok := unhealthy[devs[di].Name]
				if !ok {
					continue
				}
				reason, since := st.Reason()
				devs[di].Taints = append(devs[di].Taints, resourceapi.DeviceTaint{
					Key:    driver.UnhealthyTaintKey,
					Value:  reason,
					Effect: m.opts.TaintEffect,
					// Whole seconds, as the API server stores it, so
					// republishing does not see a difference.
					TimeAdded: &metav1.Time{Time: since.Truncate(time.Second)},
				})
			}
		}
		res.Pools[name] = pool
	}
}

// healthReport is the kubelet's view of every GPU now.
func (d *Driver) healthReport() (draplugin.DeviceHealthReport, <-chan struct{}) {
	d.mu.Lock()
	gpus := slices.Clone(d.topo.GPUs)
	d.mu.Unlock()
	m := d.health
	m.mu.Lock()
	defer m.mu.Unlock()
	now := d.clock.Now()
	unknown := ""
	if len(m.failing) > 0 {
		unknown = "health sources failing: " + slices.Sorted(maps.Keys(m.failing))[0]
	}
	r := draplugin.DeviceHealthReport{Devices: make([]draplugin.DeviceHealth, 0, len(gpus))}
	for _, g := range gpus {
		name := driver.DeviceName(g.Index)
		h := draplugin.DeviceHealth{
			PoolName:           d.opts.NodeName,
			DeviceName:         name,
			Health:             draplugin.HealthStatusHealthy,
			LastUpdated:        now,
			HealthCheckTimeout: 3 * m.opts.ResendInterval,
		}
		st := m.tracker.State(name)
		switch {
		case !st.Healthy():
			reason, _ := st.Reason()
			h.Health, h.Message = draplugin.HealthStatusUnhealthy, reason
		case unknown != "":
			h.Health, h.Message = draplugin.HealthStatusUnknown, unknown
		}
		r.Devices = append(r.Devices, h)
	}
	return r, m.changed
}

// WatchHealthStatus implements draplugin.DRAPlugin: a report of every
// GPU now, again whenever a GPU's health changes, and every
// ResendInterval so the kubelet's lease does not expire. Without health
// options the helper tells the kubelet it is not supported.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- draplugin.DeviceHealthReport) error {
	if d.health == nil {
		return draplugin.ErrHealthNotSupported
	}
	for {
		report, changed := d.healthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		timer := d.clock.NewTimer(d.health.opts.ResendInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-changed:
		case <-timer.C():
		}
		timer.Stop()
	}
}

// runHealthSources starts every source; they end with ctx.
func (d *Driver) runHealthSources(ctx context.Context, sources []HealthSource) {
	if d.health == nil {
		return
	}
	for _, s := range sources {
		go func() {
			sink := healthSink{d: d, ctx: ctx, source: s.Name()}
			err := s.Run(ctx, sink)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("stopped")
			}
			d.metrics.BackgroundErrors.Inc()
			sink.SourceFailing(err)
		}()
	}
}

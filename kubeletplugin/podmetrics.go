package kubeletplugin

import (
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/internal/sliceformat"
)

// Per-pod GPU metrics.
//
// dcgm-exporter reports every GPU's utilization, memory and so on by the
// GPU's UUID (label UUID), and names the pod only for devices it can map
// itself (the device plugin's and the NVIDIA DRA driver's). gpulink's
// GPUs get no pod from it, so the plugin exports an info series per GPU
// of each prepared claim and pod, with the same UUID label, and any
// DCGM_FI_* series joins to its pods in PromQL:
//
//	max by (UUID) (DCGM_FI_DEV_GPU_UTIL)
//	  * on (UUID) group_right
//	max by (UUID, node, gpu, namespace, pod) (gpulink_kubeletplugin_prepared_gpu_info)
//
// group_right, not group_left: with shares, or a claim several pods use,
// one GPU has several info series (one per claim and pod), so the info
// side is the "many" side and DCGM's one series per GPU the "one" side.
// The max by () on either side drops the target labels of two plugin
// instances scraped side by side during a rolling upgrade and of DCGM's
// own pod attribution, which would otherwise make a side non-unique.
//
// What the plugin knows: the claim's namespace and name, the pods in its
// status.reservedFor when the kubelet prepared it, the GPU (device name,
// UUID) and the share's limits. What it does not: the container (the
// plugin sees claims, never pods, and which containers of a pod use a
// claim is written in the pod), and pods reserving a claim after the
// kubelet prepared it (the kubelet prepares a claim once, for the first
// of the pods that share it, and does not call the plugin for the
// others). A claim that lists no pod gets one series with no pod label.

// PreparedGPUInfoName is the info series of the GPUs of prepared claims.
const PreparedGPUInfoName = "gpulink_kubeletplugin_prepared_gpu_info"

// PreparedGPUInfoLabels are the labels of PreparedGPUInfoName: the node,
// the GPU's device name (gpu-<index>) and UUID (named as dcgm-exporter
// names it, so that `on (UUID)` joins), the claim's namespace, a pod in
// its reservedFor, the claim's name, kind (whole or share), and for
// shares the sharing strategy and the limits: memory in bytes and the
// percentage of the SMs (the sums of the claim's shares of that GPU).
var PreparedGPUInfoLabels = []string{"node", "gpu", "UUID", "namespace", "pod", "claim", "kind", "strategy", "share_memory_bytes", "share_cores"}

// Values of the kind label.
const (
	gpuKindWhole = "whole"
	gpuKindShare = "share"
)

// PreparedPod is a pod the claim was reserved for when it was prepared.
type PreparedPod struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// claimPods returns the pods in the claim's reservedFor, in its order.
// Other consumers (the API allows any resource) are not pods and are
// left out.
func claimPods(claim *resourceapi.ResourceClaim) []PreparedPod {
	var out []PreparedPod
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		out = append(out, PreparedPod{Name: r.Name, UID: r.UID})
	}
	return out
}

// notePods records the pods of an already prepared claim when the
// kubelet's call lists others than the checkpoint has, and reports
// whether it changed anything.
func (pc *PreparedClaim) notePods(claim *resourceapi.ResourceClaim) bool {
	pods := claimPods(claim)
	if slices.Equal(pods, pc.Pods) {
		return false
	}
	pc.Pods = pods
	return true
}

// preparedGPUCollector serves PreparedGPUInfoName from a snapshot that the
// driver replaces after every checkpoint write, so a scrape never waits
// for a prepare (which may wait a minute for an MPS daemon).
type preparedGPUCollector struct {
	desc *prometheus.Desc

	mu     sync.Mutex
	series [][]string
}

func newPreparedGPUCollector() *preparedGPUCollector {
	return &preparedGPUCollector{desc: prometheus.NewDesc(PreparedGPUInfoName,
		"1 for each GPU of a prepared ResourceClaim and each pod in the claim's reservedFor; join DCGM_FI_* series on (UUID) to attribute them to pods.",
		PreparedGPUInfoLabels, nil)}
}

func (c *preparedGPUCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *preparedGPUCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	series := c.series
	c.mu.Unlock()
	for _, values := range series {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, values...)
	}
}

// set replaces the series with those of the checkpoint's prepared claims.
func (c *preparedGPUCollector) set(node string, cp *Checkpoint) {
	series := preparedGPUSeries(node, cp)
	c.mu.Lock()
	c.series = series
	c.mu.Unlock()
}

// preparedGPUSeries returns the label values of PreparedGPUInfoName for
// the claims of cp that are PrepareCompleted: per claim, GPU and pod. A
// claim's shares of one GPU are one series with their summed limits, as
// its containers see them (GPULINK_SHARE_*_<i>). Admin-access results are
// included: their containers use the GPU too.
func preparedGPUSeries(node string, cp *Checkpoint) [][]string {
	if cp == nil {
		return nil
	}
	var out [][]string
	for _, pc := range cp.Claims {
		if pc.State != PrepareCompleted {
			continue
		}
		pods := pc.Pods
		if len(pods) == 0 {
			pods = []PreparedPod{{}}
		}
		for _, g := range foldClaimGPUs(pc.Devices) {
			kind, strategy, mem, cores := gpuKindWhole, "", "", ""
			if g.share != nil {
				kind, strategy = gpuKindShare, string(g.share.Strategy)
				mem = strconv.FormatInt(g.share.MemoryBytes, 10)
				cores = strconv.FormatInt(g.share.Cores, 10)
			}
			for _, p := range pods {
				out = append(out, []string{node, g.device, g.uuid, pc.Namespace, p.Name, pc.Name, kind, strategy, mem, cores})
			}
		}
	}
	return out
}

// infoGPU is one GPU of a claim with its summed share (nil: whole).
type infoGPU struct {
	device, uuid string
	share        *PreparedShare
}

// foldClaimGPUs sums a claim's results per GPU, in the order they come.
// The cores are capped at 100 % as the claim's containers get them; the
// strategy is the first share's (checkClaimShape allows one per GPU).
func foldClaimGPUs(devices []PreparedDevice) []infoGPU {
	var out []infoGPU
	at := map[string]int{}
	for _, d := range devices {
		i, ok := at[d.Device]
		if !ok {
			i = len(out)
			at[d.Device] = i
			out = append(out, infoGPU{device: d.Device, uuid: d.UUID})
		}
		if d.Share == nil {
			continue
		}
		if out[i].share == nil {
			out[i].share = &PreparedShare{Strategy: d.Share.Strategy}
		}
		out[i].share.MemoryBytes += d.Share.MemoryBytes
		out[i].share.Cores = min(out[i].share.Cores+d.Share.Cores, sliceformat.CoresTotal)
	}
	return out
}

package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

// mib is the unit of MPS pinned memory limits ("<n>M"), maxThreadPercentage
// the largest active thread percentage.
const (
	mib                 = 1 << 20
	maxThreadPercentage = 100
)

// ControlBinary is the MPS control program in the driver root.
const ControlBinary = "nvidia-cuda-mps-control"

// Where driver installs keep the MPS binaries and libcuda, relative to the
// driver root (host installs of Debian/Ubuntu and RHEL, the GPU
// operator's driver container).
var (
	mpsBinDirs = []string{"usr/bin", "bin", "usr/local/bin"}
	mpsLibDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "usr/lib"}
)

// Labels of the daemon pods, so they can be listed and told apart.
const (
	mpsComponentLabel = "app.kubernetes.io/component"
	mpsComponentValue = "mps-control-daemon"
	mpsClaimLabel     = driver.Name + "/claim-uid"
	mpsNodeLabel      = driver.Name + "/node"
	// mpsGroupLabel marks a Concurrent daemon pod (instead of
	// mpsClaimLabel) with its sharing group, the claims' namespace.
	mpsGroupLabel = driver.Name + "/mps-group"
)

// PodDaemonConfig configures PodDaemon.
type PodDaemonConfig struct {
	Pods  corev1client.PodsGetter
	Nodes corev1client.NodesGetter // optional: the Node becomes the pods' owner
	// Namespace and Image of the daemon pods: the plugin's own namespace
	// and image (the image only provides glibc; the daemon binary comes
	// from the driver root).
	Namespace, Image string
	NodeName         string
	// DriverRoot is the driver root on the host; DriverRootMount is where
	// it is visible to the plugin (the daemon pods mount it at
	// mpsPodDriverRoot).
	DriverRoot, DriverRootMount string
	// Run runs nvidia-cuda-mps-control in the plugin container to talk to
	// a daemon through its pipe directory (ExecCommand when nil).
	Run CommandRunner
	// PollInterval and StartTimeout bound the wait for a new daemon to
	// answer (1s and 60s when zero: an image pull may be needed).
	PollInterval, StartTimeout time.Duration
}

// PodDaemon runs each MPS control daemon (nvidia-cuda-mps-control -f
// from the driver root: an Isolated claim's, or a sharing group's on one
// GPU) in a pod of its own, bound to this node, so that the daemon
// outlives plugin restarts and upgrades; see doc.go for why a pod.
type PodDaemon struct {
	cfg PodDaemonConfig
	// binDir holds nvidia-cuda-mps-control and libDirs are the driver's
	// library directories, relative to the driver root.
	binDir  string
	libDirs []string
}

// mpsPodDriverRoot is where a daemon pod mounts the driver root. Fixed
// rather than --driver-root-mount: a plugin running on the host has the
// driver root at "/", which a container cannot mount it over.
const mpsPodDriverRoot = "/driver-root"

// NewPodDaemon finds nvidia-cuda-mps-control and the driver's library
// directories under the driver root mount, so that a node without them
// fails at plugin start and not at the first MPS claim.
func NewPodDaemon(cfg PodDaemonConfig) (*PodDaemon, error) {
	switch {
	case cfg.Pods == nil:
		return nil, errors.New("MPS daemon pods: no API client")
	case cfg.Namespace == "":
		return nil, errors.New("--mps-daemon-namespace: empty; the MPS control daemon pods need a namespace (the plugin's own)")
	case cfg.Image == "":
		return nil, errors.New("--mps-daemon-image: empty; the MPS control daemon pods need an image (the plugin's own)")
	case cfg.NodeName == "":
		return nil, errors.New("MPS daemon pods: node name is empty")
	case cfg.DriverRoot == "" || cfg.DriverRootMount == "":
		return nil, fmt.Errorf("MPS daemon pods: --driver-root %q and --driver-root-mount %q must both be set", cfg.DriverRoot, cfg.DriverRootMount)
	}
	d := &PodDaemon{cfg: cfg}
	var err error
	if d.binDir, d.libDirs, err = findMPSDriver(cfg.DriverRootMount); err != nil {
		return nil, err
	}
	if d.cfg.Run == nil {
		d.cfg.Run = ExecCommand
	}
	if d.cfg.PollInterval == 0 {
		d.cfg.PollInterval = time.Second
	}
	if d.cfg.StartTimeout == 0 {
		d.cfg.StartTimeout = time.Minute
	}
	return d, nil
}

// findMPSDriver finds nvidia-cuda-mps-control and the driver's library
// directories under the driver root visible at mount; both paths come back
// relative to the driver root.
func findMPSDriver(mount string) (binDir string, libDirs []string, err error) {
	for _, dir := range mpsBinDirs {
		p := filepath.Join(mount, dir, ControlBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			binDir = dir
			break
		}
	}
	if binDir == "" {
		return "", nil, fmt.Errorf("--driver-root-mount %s: no %s in %s; MPS sharing needs the driver's compute utilities", mount, ControlBinary, strings.Join(mpsBinDirs, ", "))
	}
	for _, dir := range mpsLibDirs {
		if _, err := os.Stat(filepath.Join(mount, dir, "libcuda.so.1")); err == nil {
			libDirs = append(libDirs, dir)
		}
	}
	if len(libDirs) == 0 {
		return "", nil, fmt.Errorf("--driver-root-mount %s: no libcuda.so.1 in %s; the MPS daemon cannot run without the driver's libraries", mount, strings.Join(mpsLibDirs, ", "))
	}
	return binDir, libDirs, nil
}

// mpsPodName is the name of a share's daemon pod: gpulink-mps-<claim UID>
// for an Isolated share, gpulink-mps-<group>-gpu-<GPU UUID> for a
// Concurrent one (GroupID; at most 12+63+41 = 116 characters of the 253 a
// pod name may have; the kubelet cuts the pod's hostname to 63).
func mpsPodName(share Share) string { return mpsPodPrefix + share.ID() }

// mpsPodPrefix starts every daemon pod's name; the chart's admission
// policy (kubeletplugin-pod-admission.yaml) holds the plugin to it.
const mpsPodPrefix = "gpulink-mps-"

// controlBin is nvidia-cuda-mps-control under the driver root mounted at
// root.
func (d *PodDaemon) controlBin(root string) string {
	return filepath.Join(root, d.binDir, ControlBinary)
}

// env is the environment of the daemon and of the control client, with
// the driver root mounted at root: both find the daemon by its pipe
// directory, and the binary needs the driver's libraries (and the daemon
// finds nvidia-cuda-mps-server next to it through PATH).
func (d *PodDaemon) env(root string, share Share, dirs Dirs) []string {
	libs := make([]string, len(d.libDirs))
	for i, l := range d.libDirs {
		libs[i] = filepath.Join(root, l)
	}
	return []string{
		"LD_LIBRARY_PATH=" + strings.Join(libs, ":"),
		"PATH=" + filepath.Join(root, d.binDir) + ":/usr/bin:/bin",
		"CUDA_VISIBLE_DEVICES=" + share.visibleDevices(),
		"CUDA_MPS_PIPE_DIRECTORY=" + dirs.Pipe,
		"CUDA_MPS_LOG_DIRECTORY=" + dirs.Log,
	}
}

// pod is the daemon pod of a share. The pipe and log directories are
// mounted at their host paths (the same paths the plugin and the claim's
// containers use), the share's shm directory as /dev/shm.
func (d *PodDaemon) pod(share Share, dirs Dirs, owner *metav1.OwnerReference) *corev1.Pod {
	var env []corev1.EnvVar
	for _, kv := range d.env(mpsPodDriverRoot, share, dirs) {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	dir := corev1.HostPathDirectory
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      mpsPodName(share),
			Namespace: d.cfg.Namespace,
			Labels: map[string]string{
				"app.kubernetes.io/name": "gpulink",
				mpsComponentLabel:        mpsComponentValue,
				mpsNodeLabel:             d.cfg.NodeName,
			},
		},
		Spec: corev1.PodSpec{
			// Bound to this node directly: the scheduler has no say, and
			// the pod must run even while the node is cordoned.
			NodeName:                     d.cfg.NodeName,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:  "mps-control-daemon",
				Image: d.cfg.Image,
				// The plugin runs from this image, so the node has it;
				// a pull (":latest" would be Always) only adds a
				// registry dependency to every prepare.
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{d.controlBin(mpsPodDriverRoot), "-f"},
				Env:             env,
				// The daemon and the server it spawns open the claim's
				// GPUs' device nodes, /dev/nvidiactl and the uvm nodes:
				// the MPS daemon device plugin (deviceplugin.go)
				// hands exactly those to a pod asking for its GPUs'
				// resources, so the container needs no privilege. It
				// needs root and setuid/setgid for something else:
				// see mpsDaemonSecurityContext.
				Resources:       d.resources(share),
				SecurityContext: mpsDaemonSecurityContext(),
				VolumeMounts: []corev1.VolumeMount{
					{Name: "driver-root", MountPath: mpsPodDriverRoot, ReadOnly: true},
					{Name: "mps", MountPath: dirs.Base},
					{Name: "shm", MountPath: "/dev/shm"},
				},
			}},
			// Directory, not DirectoryOrCreate: a pod that outlives its
			// claim must not recreate the directories Stop removed.
			Volumes: []corev1.Volume{
				{Name: "driver-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.cfg.DriverRoot, Type: &dir}}},
				{Name: "mps", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dirs.Base, Type: &dir}}},
				{Name: "shm", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dirs.Shm, Type: &dir}}},
			},
		},
	}
	if share.Concurrent() {
		pod.Labels[mpsGroupLabel] = share.Group
	} else {
		pod.Labels[mpsClaimLabel] = share.ID()
	}
	if owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return pod
}

// resources asks for one slot of each of the share's GPUs'
// DaemonResourceName; the API server copies limits to requests.
func (d *PodDaemon) resources(share Share) corev1.ResourceRequirements {
	limits := corev1.ResourceList{}
	for _, g := range share.GPUs {
		limits[DaemonResourceName(g.Index)] = resource.MustParse("1")
	}
	return corev1.ResourceRequirements{Limits: limits}
}

// mpsDaemonSecurityContext is the daemon container's security context;
// the chart's admission policy allows exactly this. The control daemon
// starts each client's MPS server under the client's user ID (NVIDIA's
// nvidia-cuda-mps-control(1)), so it must be root and keep CAP_SETUID and
// CAP_SETGID; every other capability is dropped. As the image's non-root
// user (65532) without capabilities, as the chart ran it before, a client
// of another user cannot connect: make gpu-check saw CUDA fail with "MPS
// client failed to connect to the MPS control daemon or the MPS server"
// for a client of UID 1000 on an H200 (2026-11-28), and the daemon as UID
// 0 with only these two capabilities serve it with the share's memory
// limit. Root without CAP_DAC_OVERRIDE still writes the pipe and log
// directories, which the plugin (root) creates and so root owns.
func mpsDaemonSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser:                ptr.To[int64](0),
		RunAsGroup:               ptr.To[int64](0),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"},
			Add:  []corev1.Capability{"SETUID", "SETGID"},
		},
	}
}

// DaemonPod is the pod Start creates for the share, without its owner:
// for tests that check it against the chart's admission policy.
func (d *PodDaemon) DaemonPod(share Share, dirs Dirs) *corev1.Pod {
	return d.pod(share, dirs, nil)
}

// nodeOwner makes the Node the owner of the daemon pods, so that the
// garbage collector removes them with the Node. Not the plugin's pod: an
// upgrade replaces it, and the daemons must survive that.
func (d *PodDaemon) nodeOwner(ctx context.Context) (*metav1.OwnerReference, error) {
	if d.cfg.Nodes == nil {
		return nil, nil
	}
	node, err := d.cfg.Nodes.Nodes().Get(ctx, d.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting node %s for the daemon pod's owner: %w", d.cfg.NodeName, err)
	}
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}, nil
}

package gpucheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// podKubelet plays the kubelet for the MPS daemon pods that the plugin's
// mps.PodDaemon creates through a fake API client: it runs each pod's one
// container with runc, from the pod as the API server would store it,
// the way a kubelet with containerd would: the command and environment,
// the hostPath volumes as bind mounts, the user (the pod's runAsUser, else
// the image's USER, imageUID), the capabilities (none left after
// drop ALL), no privilege escalation, and the device nodes the MPS daemon
// device plugin hands a pod for its mps-daemon.gpu.gpulink.dev resources.
// The pod is Running while the container runs, Failed with its exit code
// and output when it ends; deleting the pod kills the container.
type podKubelet struct {
	run             Runner
	runc, stateDir  string
	workDir         string
	stat            func(string) (fs.FileInfo, error)
	minors          map[int]int // GPU index -> minor, for the device nodes
	override        *daemonUser
	cs              *fake.Clientset
	containerPrefix string

	mu   sync.Mutex
	pods map[string]*runningPod
	// last is the pod stopped last, for its output in an error.
	last *runningPod
}

// daemonUser overrides the pod's user and capabilities (a variant that is
// not the chart's); the claim's pipe and log directories, which the plugin
// (root) created, are given to that user, so that only the user and the
// capabilities differ from the chart's pod.
type daemonUser struct {
	UID, GID uint32
	Caps     []string
}

// imageUID and imageGID are the image's USER (deployments/container/
// Dockerfile, distroless's nonroot), which a pod without runAsUser gets.
const (
	imageUID = 65532
	imageGID = 65532
)

type runningPod struct {
	id   string
	uid  uint32
	done chan struct{}
	out  []byte
	err  error
}

// podNamespace is where the fake API keeps the daemon pods.
const podNamespace = "gpulink"

// newPodKubelet installs the kubelet's reactors on a new fake clientset.
func newPodKubelet(k *podKubelet) *podKubelet {
	k.cs = fake.NewClientset()
	k.pods = map[string]*runningPod{}
	k.cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if err := k.start(pod); err != nil {
			return true, nil, err
		}
		pod.Status.Phase = corev1.PodRunning
		return false, nil, nil // the tracker stores it
	})
	k.cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.stop(a.(k8stesting.DeleteAction).GetName())
		return false, nil, nil
	})
	return k
}

// start runs the pod's container in the background.
func (k *podKubelet) start(pod *corev1.Pod) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.pods[pod.Name]; ok {
		return fmt.Errorf("pod %s already runs", pod.Name)
	}
	id := fmt.Sprintf("%s-%d", k.containerPrefix, len(k.pods)+1)
	dir := filepath.Join(k.workDir, "pods", id)
	spec, uid, err := k.podSpec(pod, dir)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("pod %s: encoding the OCI spec: %w", pod.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	p := &runningPod{id: id, uid: uid, done: make(chan struct{})}
	k.pods[pod.Name] = p
	go func() {
		// Foreground runc: the call ends when the daemon does.
		out, err := k.run(context.Background(), k.runc, "--root", k.stateDir, "run", "--bundle", dir, id)
		k.mu.Lock()
		p.out, p.err = out, err
		k.mu.Unlock()
		close(p.done)
		k.ended(pod, out, err)
	}()
	return nil
}

// ended marks the pod Failed (or Succeeded) with the container's output,
// as the kubelet reports a container that exited.
func (k *podKubelet) ended(pod *corev1.Pod, out []byte, err error) {
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	obj, gerr := k.cs.Tracker().Get(gvr, pod.Namespace, pod.Name)
	if gerr != nil {
		return // deleted: stop killed it
	}
	p := obj.(*corev1.Pod).DeepCopy()
	code := int32(0)
	p.Status.Phase = corev1.PodSucceeded
	if err != nil {
		code, p.Status.Phase = 1, corev1.PodFailed
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "mps-control-daemon", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", Message: lastLines(out, 4)},
	}}}
	_ = k.cs.Tracker().Update(gvr, p, pod.Namespace)
}

// stop kills the pod's container and waits for it to end.
func (k *podKubelet) stop(name string) {
	k.mu.Lock()
	p, ok := k.pods[name]
	delete(k.pods, name)
	if ok {
		k.last = p
	}
	k.mu.Unlock()
	if !ok {
		return
	}
	ctx := context.Background()
	_, _ = k.run(ctx, k.runc, "--root", k.stateDir, "kill", p.id, "KILL")
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	_, _ = k.run(ctx, k.runc, "--root", k.stateDir, "delete", "--force", p.id)
}

// podSpec translates the pod's container into an OCI spec under dir.
func (k *podKubelet) podSpec(pod *corev1.Pod, dir string) (*specs.Spec, uint32, error) {
	if len(pod.Spec.Containers) != 1 {
		return nil, 0, fmt.Errorf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, 0, err
		}
	}
	// The image's user database (distroless's root and nonroot).
	if err := os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644); err != nil {
		return nil, 0, err
	}
	// The image provides glibc; the host's system directories do here.
	mounts, err := hostRootfs(rootfs, "/")
	if err != nil {
		return nil, 0, err
	}
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	spec := baseSpec(append(append([]string{}, c.Command...), c.Args...), nil)
	if hasEnv(env, "PATH") {
		spec.Process.Env = slices.DeleteFunc(spec.Process.Env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") })
	}
	spec.Process.Env = append(spec.Process.Env, env...)
	// The kubelet's container: its user and capabilities, no /dev/shm
	// of its own (the pod mounts one), the pod's volumes.
	uid, gid := uint32(imageUID), uint32(imageGID)
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		uid = uint32(*sc.RunAsUser)
	}
	if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil {
		uid = uint32(*sc.RunAsUser)
	}
	if sc := c.SecurityContext; sc != nil && sc.RunAsGroup != nil {
		gid = uint32(*sc.RunAsGroup)
	}
	caps := containerCaps(c.SecurityContext)
	if o := k.override; o != nil {
		uid, gid, caps = o.UID, o.GID, o.Caps
	}
	spec.Process.User = specs.User{UID: uid, GID: gid}
	spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	spec.Process.NoNewPrivileges = c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || !*c.SecurityContext.AllowPrivilegeEscalation
	spec.Mounts = slices.DeleteFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev/shm" })
	spec.Mounts = append(spec.Mounts, mounts...)
	volumes := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath == nil {
			return nil, 0, fmt.Errorf("volume %s: only hostPath volumes are run here", v.Name)
		}
		volumes[v.Name] = v.HostPath.Path
	}
	for _, m := range c.VolumeMounts {
		src, ok := volumes[m.Name]
		if !ok {
			return nil, 0, fmt.Errorf("volume mount %s: no such volume", m.Name)
		}
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.MountPath, Type: "bind", Source: src, Options: opts})
		if k.override != nil && m.Name == "mps" {
			for _, sub := range []string{"pipe", "log"} {
				if err := os.Chown(filepath.Join(src, sub), int(uid), int(gid)); err != nil {
					return nil, 0, err
				}
			}
		}
	}
	devs, err := k.devices(c.Resources.Limits)
	if err != nil {
		return nil, 0, err
	}
	for _, d := range devs {
		spec.Linux.Devices = append(spec.Linux.Devices, d)
		major, minor := d.Major, d.Minor
		spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rw"})
	}
	return spec, uid, nil
}

// hasEnv tells whether env sets name.
func hasEnv(env []string, name string) bool {
	return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
}

// containerCaps are the capabilities a container keeps: the runtime's
// default set, less drop (ALL: all of them), plus add.
func containerCaps(sc *corev1.SecurityContext) []string {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	if sc == nil || sc.Capabilities == nil {
		return caps
	}
	for _, d := range sc.Capabilities.Drop {
		if d == "ALL" {
			caps = nil
			break
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == "CAP_"+string(d) })
	}
	for _, a := range sc.Capabilities.Add {
		caps = append(caps, "CAP_"+string(a))
	}
	return caps
}

// devices are the device nodes of the pod's daemon resources, as the MPS
// daemon device plugin's Allocate gives them.
func (k *podKubelet) devices(limits corev1.ResourceList) ([]specs.LinuxDevice, error) {
	var paths []string
	for i, minor := range k.minors {
		if _, ok := limits[mps.DaemonResourceName(i)]; ok {
			paths = append(paths, fmt.Sprintf("/dev/nvidia%d", minor))
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("the pod asks for none of the daemon resources of GPUs %v", k.minors)
	}
	paths = append(paths, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
	var devs []specs.LinuxDevice
	for _, p := range paths {
		fi, err := k.stat(p)
		if err != nil {
			return nil, fmt.Errorf("device node %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil, fmt.Errorf("device node %s: no device numbers", p)
		}
		mode := fi.Mode().Perm()
		devs = append(devs, specs.LinuxDevice{Path: p, Type: "c", Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)), FileMode: &mode})
	}
	return devs, nil
}

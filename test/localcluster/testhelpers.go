package localcluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// FreePort returns a TCP port on 127.0.0.1 that the kernel found free, for
// a gpulink binary a test starts (its metrics or health address).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// MkDeviceNodes creates stand-ins for the NVIDIA device nodes of gpus GPUs
// under root/dev (character devices with /dev/null's numbers, so containerd
// can create them in containers) and reports whether mknod was permitted.
func MkDeviceNodes(t testing.TB, root string, gpus int) bool {
	t.Helper()
	if err := MakeDeviceNodes(root, gpus); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Logf("mknod not permitted (%v): checking the environment only, not /dev entries", err)
			return false
		}
		t.Fatal(err)
	}
	return true
}

// MakeDeviceNodes is MkDeviceNodes for a program (hack/demo.sh's driver
// root, through test/e2e/cmd/demoreport): an error wrapping unix.EPERM
// says mknod is not permitted. Nodes that exist already are kept.
func MakeDeviceNodes(root string, gpus int) error {
	dev := filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for i := range gpus {
		names = append(names, fmt.Sprintf("nvidia%d", i))
	}
	for _, n := range names {
		if err := unix.Mknod(filepath.Join(dev, n), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mknod %s: %w", filepath.Join(dev, n), err)
		}
	}
	return nil
}

// MkMIGCapNodes creates stand-ins for the MIG capability device nodes
// root/dev/nvidia-caps/nvidia-cap<minor> that grant access to GPU and
// compute instances (what a MIG device's CDI spec adds besides its GPU's
// node), as MkDeviceNodes does, and reports whether mknod was permitted.
func MkMIGCapNodes(t testing.TB, root string, minors ...int) bool {
	t.Helper()
	dir := filepath.Join(root, "dev", "nvidia-caps")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range minors {
		if err := unix.Mknod(filepath.Join(dir, fmt.Sprintf("nvidia-cap%d", m)), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			if errors.Is(err, unix.EPERM) {
				t.Logf("mknod not permitted (%v): checking the environment only, not /dev/nvidia-caps entries", err)
				return false
			}
			t.Fatal(err)
		}
	}
	return true
}

// ReadPodLogFile returns what container of pod wrote, read from the
// kubelet's pod log directory podLogDir (<podLogDir>/<ns>_<pod>_<uid>/
// <container>/N.log, the newest file, in CRI format "<time> <stream> <tag>
// <line>"), for when the API server cannot fetch the log from the kubelet.
func ReadPodLogFile(podLogDir string, pod *corev1.Pod, container string) (string, error) {
	pattern := filepath.Join(podLogDir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container, "*.log")
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no log file %s (%v)", pattern, err)
	}
	data, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 {
			out.WriteString(f[3] + "\n")
		}
	}
	return out.String(), nil
}

// FakeDriverVersion is the version of the driver install WriteFakeDriver
// lays out.
const FakeDriverVersion = "580.95.05"

// WriteFakeDriver lays out a driver install's files under root (as a host
// install or the GPU Operator's driver container has them: enough for
// nvcdi to find the driver) and returns the paths a container should see
// them at.
func WriteFakeDriver(t testing.TB, root string) []string {
	t.Helper()
	files, err := WriteFakeDriverFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// WriteFakeDriverFiles is WriteFakeDriver for a program (hack/demo.sh's
// driver root, through test/e2e/cmd/demoreport).
func WriteFakeDriverFiles(root string) ([]string, error) {
	lib := "/usr/lib/x86_64-linux-gnu/"
	files := []string{
		lib + "libcuda.so." + FakeDriverVersion,
		lib + "libnvidia-ml.so." + FakeDriverVersion,
		"/usr/bin/nvidia-smi",
		"/lib/firmware/nvidia/" + FakeDriverVersion + "/gsp_ga10x.bin",
	}
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte("fake driver file\n"), 0o755); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// RunShared is a TestMain body for a package whose tests share one
// cluster: it starts the cluster in a temporary directory named after
// prefix (opts.Dir and opts.Logf are set here; logs go to stderr), hands it
// to use, runs the tests, then stops the cluster and removes the
// directory. It returns the exit code for os.Exit.
func RunShared(m *testing.M, prefix string, opts Options, use func(*Cluster)) int {
	dir, err := MkdirTemp(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts.Dir = dir
	opts.Logf = func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "localcluster: "+f+"\n", a...)
	}
	cluster, err := Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting local cluster: %v\n", err)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping local cluster: %v\n", err)
		}
	}()
	use(cluster)
	return m.Run()
}

// StartForTest starts a cluster for one test in dir/c (opts.Dir is set
// here; opts.Logf defaults to t.Logf) and stops it when the test ends,
// reporting a failure to stop; a failure to start fails the test. The
// caller owns dir: where it lives and whether it is kept.
func StartForTest(ctx context.Context, t testing.TB, dir string, opts Options) *Cluster {
	t.Helper()
	opts.Dir = filepath.Join(dir, "c")
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	cluster, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	return cluster
}

// KlogVerbosityFromEnv sets the klog verbosity (-v) of the test process's
// in-process components from $GPULINK_V, when set.
func KlogVerbosityFromEnv() {
	fs := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(fs)
	if v := os.Getenv("GPULINK_V"); v != "" {
		_ = fs.Set("v", v)
	}
}

// UntaintNewNode removes the taints of n, a node just created (as Create
// returned it): the NodeTaint admission plugin adds the not-ready taint on
// create and, with the node lifecycle controller off, nothing removes it.
// It retries on conflicts, reading the node again; a nil n is left alone.
func UntaintNewNode(ctx context.Context, client kubernetes.Interface, n *corev1.Node) error {
	for n != nil && len(n.Spec.Taints) > 0 {
		name := n.Name
		n.Spec.Taints = nil
		_, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("untainting node %s: %w", name, err)
		}
		if n, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading node %s: %w", name, err)
		}
	}
	return nil
}

// DeleteClaims deletes the namespace's ResourceClaims for a test's
// teardown, stripping their finalizers (gpulink's stays until a controller
// releases the claim, and the test's controller may be gone), and waits up
// to 30 s for them to go. Errors are ignored: it is cleanup.
func DeleteClaims(ctx context.Context, client kubernetes.Interface, ns string) {
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			c := &l.Items[i]
			if len(c.Finalizers) > 0 {
				c.Finalizers = nil
				_, _ = client.ResourceV1().ResourceClaims(ns).Update(ctx, c, metav1.UpdateOptions{})
			}
			_ = client.ResourceV1().ResourceClaims(ns).Delete(ctx, c.Name, metav1.DeleteOptions{})
		}
		return len(l.Items) == 0, nil
	})
}

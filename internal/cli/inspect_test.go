package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

const fakeServer = "https://fake.example:6443"

// fakeClient is a clientFactory serving objs from client-go's fake clientset.
func fakeClient(objs ...runtime.Object) (clientFactory, *fake.Clientset) {
	cs := fake.NewClientset(objs...)
	return func(*inspectOptions) (kubernetes.Interface, string, error) { return cs, fakeServer, nil }, cs
}

// runInspectCmd runs `gpulink inspect args...` against the client factory.
func runInspectCmd(t *testing.T, newClient clientFactory, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := NewRootCommand("gpulink")
	for _, c := range root.Commands() {
		if c.Name() == "inspect" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(newInspectCommandWith("gpulink", newClient))
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"inspect"}, args...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.Execute()
	return out.String(), errOut.String(), err
}

// publishedSlice is the ResourceSlice the kubelet plugin publishes for node
// with a topology fixture, its GPUs named product with memory bytes each.
func publishedSlice(t testing.TB, node, fixture, product string, memory int64) *resourceapi.ResourceSlice {
	t.Helper()
	topo, err := topology.ParseFile(filepath.Join("..", "..", "driver", "topology", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	for i := range topo.GPUs {
		topo.GPUs[i].ProductName = product
	}
	s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{MemoryBytes: memory})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// heldClaim is a claim allocated with results and reserved for pods.
func heldClaim(ns, name string, pods []string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name)}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

func wholeGPU(node, dev string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: driver.Name, Pool: node, Device: dev}
}

func gpuShare(node, dev, id, mem, cores string) resourceapi.DeviceRequestAllocationResult {
	r := wholeGPU(node, dev)
	r.ShareID = ptr.To(types.UID(id))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		driver.CapacityMemory: resource.MustParse(mem),
		driver.CapacityCores:  resource.MustParse(cores),
	}
	return r
}

// demoCluster is two nodes: node-a (8 V100, NVLink hybrid cube mesh) with a
// 2-GPU training claim and two shares, node-b (4 P40 on PCIe) with one GPU
// held whole.
func demoCluster(t testing.TB) []runtime.Object {
	return []runtime.Object{
		publishedSlice(t, "node-a", "v100-sxm2-8-aliyun-sccgn6.txt", "Tesla V100-SXM2-32GB", 32<<30),
		publishedSlice(t, "node-b", "pcie-4.txt", "Tesla P40", 24<<30),
		heldClaim("team-a", "train", []string{"train-0"}, wholeGPU("node-a", "gpu-0"), wholeGPU("node-a", "gpu-3")),
		heldClaim("team-b", "infer", []string{"infer-0", "infer-1"}, gpuShare("node-a", "gpu-1", "s-1", "4Gi", "25")),
		heldClaim("team-a", "notebook", []string{"nb-0"}, gpuShare("node-a", "gpu-1", "s-2", "2Gi", "10")),
		heldClaim("team-c", "render", []string{"render-0"}, wholeGPU("node-b", "gpu-2")),
		heldClaim("team-c", "waiting", nil),
	}
}

func TestInspectTable(t *testing.T) {
	newClient, _ := fakeClient(demoCluster(t)...)
	stdout, stderr, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatalf("inspect failed: %v\nstderr:\n%s", err, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr %q, want nothing", stderr)
	}
	for _, want := range []string{
		"NODE node-a: 8 GPUs, 5 free, 1 shared, 2 held whole",
		"NODE node-b: 4 GPUs, 3 free, 0 shared, 1 held whole",
	} {
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("output lacks the summary %q:\n%s", want, stdout)
		}
	}
	// Rows are checked field by field so column widths do not matter.
	wantRows := [][]string{
		{"GPU", "PRODUCT", "MEMORY", "FREE", "HELD", "CLAIM", "SHARE", "RESERVED", "FOR"},
		{"gpu-0", "Tesla", "V100-SXM2-32GB", "32Gi", "none", "whole", "team-a/train", "-", "pods/train-0"},
		{"gpu-1", "Tesla", "V100-SXM2-32GB", "32Gi", "26Gi,", "65", "cores", "share", "team-a/notebook", "2Gi,", "10", "cores", "pods/nb-0"},
		{"share", "team-b/infer", "4Gi,", "25", "cores", "pods/infer-0,pods/infer-1"},
		{"gpu-2", "Tesla", "V100-SXM2-32GB", "32Gi", "whole", "GPU", "-", "-", "-", "-"},
		{"gpu-3", "Tesla", "V100-SXM2-32GB", "32Gi", "none", "whole", "team-a/train", "-", "pods/train-0"},
		{"gpu-2", "Tesla", "P40", "24Gi", "none", "whole", "team-c/render", "-", "pods/render-0"},
		// The link matrices, decoded from the published links attributes.
		{"GPU0", "X", "NV1", "NV1", "NV2", "SYS", "SYS", "NV2", "SYS", "-", "-"}, // the fixture has no NUMA column
		{"GPU3", "SYS", "SYS", "PIX", "X", "1", "-"},
	}
	lines := strings.Split(stdout, "\n")
	for _, want := range wantRows {
		found := false
		for _, l := range lines {
			if reflect.DeepEqual(strings.Fields(l), want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("output lacks the row %q:\n%s", strings.Join(want, " "), stdout)
		}
	}
	if strings.Index(stdout, "NODE node-a") > strings.Index(stdout, "NODE node-b") {
		t.Errorf("nodes are not in name order:\n%s", stdout)
	}
	if strings.Contains(stdout, "waiting") {
		t.Errorf("the unallocated claim team-c/waiting is shown:\n%s", stdout)
	}
}

// inspectJSON mirrors the documented --output json shape, decoded without
// the command's own types so the test pins the wire format.
type inspectJSON struct {
	Nodes []struct {
		Name    string `json:"name"`
		Pool    string `json:"pool"`
		Problem string `json:"problem"`
		GPUs    []struct {
			Device      string `json:"device"`
			Index       int    `json:"index"`
			Product     string `json:"product"`
			MemoryBytes int64  `json:"memoryBytes"`
			Cores       int64  `json:"cores"`
			Whole       []struct {
				Namespace   string   `json:"namespace"`
				Name        string   `json:"name"`
				ReservedFor []string `json:"reservedFor"`
			} `json:"whole"`
			Shares []struct {
				Claim struct {
					Namespace   string   `json:"namespace"`
					Name        string   `json:"name"`
					ReservedFor []string `json:"reservedFor"`
				} `json:"claim"`
				ShareID     string `json:"shareID"`
				MemoryBytes int64  `json:"memoryBytes"`
				Cores       int64  `json:"cores"`
			} `json:"shares"`
			Free            bool     `json:"free"`
			FreeMemoryBytes int64    `json:"freeMemoryBytes"`
			FreeCores       int64    `json:"freeCores"`
			Taints          []string `json:"taints"`
			Problems        []string `json:"problems"`
		} `json:"gpus"`
		UnknownDevices []struct {
			Device string `json:"device"`
			Claim  struct {
				Namespace   string   `json:"namespace"`
				Name        string   `json:"name"`
				ReservedFor []string `json:"reservedFor"`
			} `json:"claim"`
			Share       bool  `json:"share"`
			MemoryBytes int64 `json:"memoryBytes"`
			Cores       int64 `json:"cores"`
		} `json:"unknownDevices"`
		Links [][]string `json:"links"`
	} `json:"nodes"`
}

func decodeInspectJSON(t *testing.T, stdout string) inspectJSON {
	t.Helper()
	var got inspectJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("output is not the documented JSON document: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("output holds more than one JSON value:\n%s", stdout)
	}
	return got
}

func TestInspectJSON(t *testing.T) {
	newClient, _ := fakeClient(demoCluster(t)...)
	stdout, stderr, err := runInspectCmd(t, newClient, "--node", "node-a", "-o", "json")
	if err != nil {
		t.Fatalf("inspect failed: %v\nstderr:\n%s", err, stderr)
	}
	got := decodeInspectJSON(t, stdout)
	if len(got.Nodes) != 1 || got.Nodes[0].Name != "node-a" || got.Nodes[0].Pool != "node-a" {
		t.Fatalf("nodes %+v, want only node-a (--node)", got.Nodes)
	}
	n := got.Nodes[0]
	if len(n.GPUs) != 8 || len(n.Links) != 8 {
		t.Fatalf("%d GPUs and %d link rows, want 8 of each", len(n.GPUs), len(n.Links))
	}
	if want := []string{"X", "NV1", "NV1", "NV2", "SYS", "SYS", "NV2", "SYS"}; !reflect.DeepEqual(n.Links[0], want) {
		t.Errorf("links[0] = %v, want %v (the fixture's first row)", n.Links[0], want)
	}
	g0 := n.GPUs[0]
	if g0.Device != "gpu-0" || g0.Product != "Tesla V100-SXM2-32GB" || g0.MemoryBytes != 32<<30 || g0.Cores != 100 {
		t.Errorf("gpu-0 = %+v, want the published device", g0)
	}
	if len(g0.Whole) != 1 || g0.Whole[0].Namespace != "team-a" || g0.Whole[0].Name != "train" ||
		!reflect.DeepEqual(g0.Whole[0].ReservedFor, []string{"pods/train-0"}) || g0.Free {
		t.Errorf("gpu-0 whole %+v free %v, want team-a/train reserved for pods/train-0", g0.Whole, g0.Free)
	}
	g1 := n.GPUs[1]
	if len(g1.Shares) != 2 || g1.Shares[0].Claim.Name != "notebook" || g1.Shares[0].ShareID != "s-2" ||
		g1.Shares[0].MemoryBytes != 2<<30 || g1.Shares[0].Cores != 10 || g1.Shares[1].Claim.Name != "infer" {
		t.Errorf("gpu-1 shares %+v, want notebook (2Gi, 10) then infer", g1.Shares)
	}
	if g1.Free || g1.FreeMemoryBytes != 26<<30 || g1.FreeCores != 65 {
		t.Errorf("gpu-1 free %v, %d bytes, %d cores; want 26Gi and 65 cores left for shares", g1.Free, g1.FreeMemoryBytes, g1.FreeCores)
	}
	if g2 := n.GPUs[2]; !g2.Free || g2.FreeMemoryBytes != 32<<30 || g2.FreeCores != 100 {
		t.Errorf("gpu-2 %+v, want entirely free", g2)
	}
}

func TestInspectNothingToShow(t *testing.T) {
	tests := []struct {
		name       string
		objs       []runtime.Object
		args       []string
		wantStdout string
		wantStderr string
	}{
		{
			name:       "empty cluster",
			wantStderr: "No gpulink ResourceSlices found at " + fakeServer,
		},
		{
			name: "only another driver's slices and unallocated claims",
			objs: []runtime.Object{
				&resourceapi.ResourceSlice{
					ObjectMeta: metav1.ObjectMeta{Name: "nic"},
					Spec: resourceapi.ResourceSliceSpec{Driver: "nic.example.com", NodeName: ptr.To("node-a"),
						Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1}, Devices: []resourceapi.Device{{Name: "nic-0"}}},
				},
				heldClaim("ns", "pending", nil),
			},
			wantStderr: "No gpulink ResourceSlices found",
		},
		{
			name:       "empty cluster, JSON stays a document",
			args:       []string{"-o", "json"},
			wantStdout: `{"nodes": []}`, // an empty list, not null
			wantStderr: "No gpulink ResourceSlices found",
		},
		{
			name:       "unknown node",
			objs:       demoCluster(t),
			args:       []string{"--node", "node-x"},
			wantStderr: `Node "node-x" publishes no gpulink ResourceSlices`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newClient, _ := fakeClient(tt.objs...)
			stdout, stderr, err := runInspectCmd(t, newClient, tt.args...)
			if err != nil {
				t.Fatalf("inspect failed: %v (nothing to show is not an error)", err)
			}
			if tt.wantStdout == "" && stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if tt.wantStdout != "" {
				if got := decodeInspectJSON(t, stdout); got.Nodes == nil || len(got.Nodes) != 0 {
					t.Errorf("stdout %q, want %s", stdout, tt.wantStdout)
				}
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.wantStderr)
			}
		})
	}
}

func TestInspectShowsProblems(t *testing.T) {
	broken := publishedSlice(t, "node-c", "pcie-4.txt", "", 16<<30)
	broken.Spec.Pool.ResourceSliceCount = 2
	tainted := publishedSlice(t, "node-d", "pcie-4.txt", "", 16<<30)
	tainted.Spec.Devices[3].Attributes[driver.AttrProductName] = resourceapi.DeviceAttribute{StringValue: ptr.To("evil\tGPU\x1b[2J")}
	tainted.Spec.Devices[1].Taints = append(tainted.Spec.Devices[1].Taints, resourceapi.DeviceTaint{
		Key: "gpu.gpulink.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
	empty := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "cpu-node"},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver.Name, NodeName: ptr.To("cpu-node"),
			Pool: resourceapi.ResourcePool{Name: "cpu-node", Generation: 1, ResourceSliceCount: 1}, Devices: []resourceapi.Device{}},
	}
	newClient, _ := fakeClient(broken, tainted, empty,
		heldClaim("ns", "stuck", []string{"p"}, wholeGPU("node-c", "gpu-1")),
		heldClaim("ns", "ghost", nil, gpuShare("node-d", "gpu-7", "g", "1Gi", "5")),
		heldClaim("ns", "twice-a", nil, wholeGPU("node-d", "gpu-0")),
		heldClaim("ns", "twice-b", nil, wholeGPU("node-d", "gpu-0")),
	)
	stdout, stderr, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatalf("inspect failed: %v\nstderr:\n%s", err, stderr)
	}
	for _, want := range []string{
		"NODE cpu-node: no GPUs (the kubelet plugin publishes an empty pool)\n",
		"NODE node-c: unusable, the controller allocates nothing here\n",
		`  problem: pool "node-c" generation 1 is incomplete: 1 of 2 slices published` + "\n",
		"  gpu-1: not published by the node, yet held (whole) by ns/stuck, reserved for pods/p\n",
		"NODE node-d: 4 GPUs, 2 free, 0 shared, 1 held whole, 1 tainted\n",
		"gpu-1  -                   16Gi    none (tainted)",
		"  gpu-0: problem: held whole by 2 claims\n",
		"  gpu-1: tainted gpu.gpulink.dev/unhealthy=xid-79:NoExecute\n",
		"  gpu-7: not published by the node, yet held (share 1Gi, 5 cores) by ns/ghost\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	// Control characters a node publishes are quoted, not passed to the terminal.
	if !strings.Contains(stdout, `gpu-3  "evil\tGPU\x1b[2J"  16Gi`) || strings.Contains(stdout, "\x1b") {
		t.Errorf("the product name with control characters is not quoted:\n%s", stdout)
	}
	// A node that cannot be decoded has no matrix; node-d has one.
	if got := strings.Count(stdout, "\nLINKS"); got != 1 {
		t.Errorf("%d link matrices, want 1 (node-d only):\n%s", got, stdout)
	}
	// The second whole holder of gpu-0 gets a continuation row.
	if !strings.Contains(stdout, "whole  ns/twice-b") {
		t.Errorf("output lacks the second holder of gpu-0:\n%s", stdout)
	}
}

func TestInspectReadsAllPages(t *testing.T) {
	objs := demoCluster(t)
	newClient, cs := fakeClient(objs...)
	// The fake clientset ignores limit/continue; serve the claims one per
	// page to check that every page is read.
	claims := []resourceapi.ResourceClaim{}
	for _, o := range objs {
		if c, ok := o.(*resourceapi.ResourceClaim); ok {
			claims = append(claims, *c)
		}
	}
	var seen []metav1.ListOptions
	cs.PrependReactor("list", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		opts := a.(k8stesting.ListActionImpl).ListOptions
		seen = append(seen, opts)
		i := 0
		if opts.Continue != "" {
			if _, err := fmt.Sscanf(opts.Continue, "page-%d", &i); err != nil {
				return true, nil, apierrors.NewBadRequest("bad continue token " + opts.Continue)
			}
		}
		l := &resourceapi.ResourceClaimList{Items: claims[i : i+1]}
		if i+1 < len(claims) {
			l.Continue = fmt.Sprintf("page-%d", i+1)
		}
		return true, l, nil
	})
	stdout, _, err := runInspectCmd(t, newClient, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(claims) {
		t.Errorf("%d list calls, want one per claim (%d)", len(seen), len(claims))
	}
	for _, o := range seen {
		if o.Limit != listPageSize {
			t.Errorf("list limit %d, want %d", o.Limit, listPageSize)
		}
	}
	got := decodeInspectJSON(t, stdout)
	if len(got.Nodes) != 2 || len(got.Nodes[1].GPUs[2].Whole) != 1 || len(got.Nodes[0].GPUs[1].Shares) != 2 {
		t.Errorf("claims from later pages are missing:\n%s", stdout)
	}
}

func TestInspectAPIErrors(t *testing.T) {
	gr := resourceapi.Resource("resourceslices")
	tests := []struct {
		name     string
		resource string
		err      error
		want     []string
	}{
		{
			name:     "forbidden",
			resource: "resourceslices",
			err:      apierrors.NewForbidden(gr, "", fmt.Errorf("user alice cannot list")),
			want:     []string{"list ResourceSlices of driver gpu.gpulink.dev from " + fakeServer, "forbidden", "need list permission on resourceslices and resourceclaims"},
		},
		{
			name:     "API not served",
			resource: "resourceclaims",
			err:      apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), ""),
			want:     []string{"list ResourceClaims in all namespaces from " + fakeServer, "does not serve resource.k8s.io/v1"},
		},
		{
			name:     "continue token expired",
			resource: "resourceclaims",
			err:      apierrors.NewResourceExpired("The provided continue parameter is too old"),
			want:     []string{"list ResourceClaims in all namespaces", "too old", "run the command again"},
		},
		{
			name:     "expired credentials",
			resource: "resourceslices",
			err:      apierrors.NewUnauthorized("token expired"),
			want:     []string{"token expired", "credentials were rejected"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newClient, cs := fakeClient(demoCluster(t)...)
			cs.PrependReactor("list", tt.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tt.err
			})
			stdout, _, err := runInspectCmd(t, newClient)
			if err == nil {
				t.Fatalf("inspect succeeded, want an error; stdout:\n%s", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing on failure", stdout)
			}
		})
	}
}

// TestInspectUnreachableServer goes through the real kubeconfig loading
// and client, as the binary does.
func TestInspectUnreachableServer(t *testing.T) {
	// A port that was just free: nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	server := "https://" + addr
	kubeconfig := writeFile(t, t.TempDir(), "kubeconfig", `apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "`+server+`", insecure-skip-tls-verify: true}
users:
- name: alice
  user: {token: secret}
contexts:
- name: lab
  context: {cluster: lab, user: alice}
current-context: lab
`)
	missing := filepath.Join(t.TempDir(), "missing-kubeconfig")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{
			name: "connection refused",
			args: []string{"--kubeconfig", kubeconfig},
			want: []string{"Error: list ResourceSlices of driver gpu.gpulink.dev from " + server, "connection refused"},
		},
		{
			name: "KUBECONFIG is honoured",
			env:  map[string]string{"KUBECONFIG": kubeconfig},
			want: []string{"from " + server, "connection refused"},
		},
		{
			name: "missing kubeconfig file",
			args: []string{"--kubeconfig", filepath.Join(t.TempDir(), "nope")},
			want: []string{"Error: load kubeconfig (--kubeconfig ", "no such file or directory"},
		},
		{
			name: "unknown context",
			args: []string{"--kubeconfig", kubeconfig, "--context", "prod"},
			want: []string{`context "prod" does not exist`},
		},
		{
			// Missing files in $KUBECONFIG are skipped, as kubectl does; an
			// empty in-cluster environment rules out the service account
			// fallback when the tests run in a pod.
			name: "no kubeconfig at all",
			env:  map[string]string{"KUBECONFIG": missing, "KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""},
			want: []string{"Error: load kubeconfig (" + missing + "): ", "no configuration has been provided"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			stdout, stderr, code := runCLI(t, append([]string{"inspect"}, tt.args...)...)
			if code == 0 {
				t.Fatalf("exit code 0, want failure; stdout:\n%s", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
			if strings.Contains(stderr, "--help") {
				t.Errorf("stderr %q points at --help for a connection failure", stderr)
			}
		})
	}
}

func TestInspectUsage(t *testing.T) {
	_, stderr, code := runCLI(t, "inspect", "node-a")
	if code != 1 || !strings.Contains(stderr, `unknown command "node-a"`) && !strings.Contains(stderr, "accepts 0 arg(s)") {
		t.Errorf("code %d stderr %q, want a usage error for the stray argument", code, stderr)
	}
	if !strings.Contains(stderr, "Run 'gpulink inspect --help' for usage.") {
		t.Errorf("stderr %q does not point at inspect --help", stderr)
	}
	stdout, _, code := runCLI(t, "--help")
	if code != 0 || !strings.Contains(stdout, "inspect") {
		t.Errorf("root help (code %d) does not list inspect:\n%s", code, stdout)
	}
}

// TestLinkMatrixMatchesTopologyTable keeps inspect's matrix identical to
// the LINKS section of `gpulink topology`.
func TestLinkMatrixMatchesTopologyTable(t *testing.T) {
	topo, err := topology.ParseFile(v100File)
	if err != nil {
		t.Fatal(err)
	}
	v, err := newTopologyView(topo)
	if err != nil {
		t.Fatal(err)
	}
	var full, matrix bytes.Buffer
	if err := writeTopologyTable(&full, "x", topo, v); err != nil {
		t.Fatal(err)
	}
	p := &errWriter{w: tabwriter.NewWriter(&matrix, 0, 0, 2, ' ', 0)}
	writeLinkMatrix(p, v)
	if p.err != nil {
		t.Fatal(p.err)
	}
	section, _, ok := strings.Cut(full.String(), "\nNVLINK ISLANDS")
	_, section, ok2 := strings.Cut(section, "\n\n")
	if !ok || !ok2 {
		t.Fatalf("unexpected topology table layout:\n%s", full.String())
	}
	if section != matrix.String() {
		t.Errorf("matrix differs from the topology table's LINKS section:\n%s\nwant:\n%s", matrix.String(), section)
	}
}

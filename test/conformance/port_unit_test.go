//go:build e2e

package conformance_test

import (
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestPort checks the port on a v1beta1 template and a pod without a
// cluster: the `exactly:` wrapper, the class and CEL domain, a capacity
// request moving to the share class, other drivers' config kept, and the
// pod running the workload image on the real node.
func TestPort(t *testing.T) {
	docs, err := parseManifest("test.yaml", []byte(`
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: t-__INDEX__}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].productName != ''"}
      - name: share
        deviceClassName: gpu.nvidia.com
        capacity: {requests: {memory: 4Gi}}
      config:
      - opaque: {driver: test-driver.cdi.k8s.io, parameters: {a: b}}
      - opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig}}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  initContainers: [{name: i, image: ubuntu, command: [sh]}]
  containers: [{name: c, image: ubuntu, command: [sh], args: [x]}]
`), "3")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("parsed %d documents, want 2", len(docs))
	}
	for _, o := range docs {
		if err := port(o, "node-a", portOptions{dropConfig: dropNVIDIAConfig}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := yaml.Marshal(docs)
	if err != nil {
		t.Fatal(err)
	}
	want := `- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata:
    name: t-3
  spec:
    spec:
      devices:
        config:
        - opaque:
            driver: test-driver.cdi.k8s.io
            parameters:
              a: b
        requests:
        - exactly:
            deviceClassName: ` + driver.DeviceClassWhole + `
            selectors:
            - cel:
                expression: device.attributes['` + driver.Name + `'].productName != ''
          name: gpu
        - exactly:
            capacity:
              requests:
                memory: 4Gi
            deviceClassName: ` + driver.DeviceClassShare + `
          name: share
- apiVersion: v1
  kind: Pod
  metadata:
    name: p
  spec:
    containers:
    - image: ` + localcluster.WorkloadImage + `
      imagePullPolicy: Never
      name: c
    hostNetwork: true
    initContainers:
    - env:
      - name: GPULINK_WORKLOAD_EXIT
        value: "1"
      image: ` + localcluster.WorkloadImage + `
      imagePullPolicy: Never
      name: i
    nodeSelector:
      kubernetes.io/hostname: node-a
    terminationGracePeriodSeconds: 1
`
	if string(got) != want {
		t.Errorf("ported:\n%s\nwant:\n%s", got, want)
	}
}

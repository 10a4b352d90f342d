//go:build e2e

package conformance_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// occupy puts a small share on the GPU with the given index (a claim with
// a CEL selector on gpulink's index attribute) and waits until its pod
// runs: the state in which a case's allocation shows whether it weighs
// links against packing.
func (r *run) occupy(ctx context.Context, t *testing.T, index int) {
	t.Helper()
	name := fmt.Sprintf("occupy-gpu-%d", index)
	r.namespace(ctx, t, r.ns)
	_, err := r.e.client.ResourceV1().ResourceClaimTemplates(r.ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driver.DeviceClassShare,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].index == %d", driver.Name, index),
				}}},
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					driver.CapacityMemory: resource.MustParse("1Gi"),
					driver.CapacityCores:  resource.MustParse("10"),
				}},
			}}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating ResourceClaimTemplate %s: %v", r.c.files[0], name, err)
	}
	_, err = r.e.client.CoreV1().Pods(r.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: r.e.node},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &name}},
			Containers: []corev1.Container{{
				Name: "workload", Image: localcluster.WorkloadImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s: creating pod %s: %v", r.c.files[0], name, err)
	}
	r.waitPod(ctx, t, r.ns, name)
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

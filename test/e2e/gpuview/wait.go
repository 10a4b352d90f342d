package gpuview

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/driver"
)

// WaitDevices waits up to two minutes until node's gpulink slices publish
// n devices, failing early with alive's error (the kubelet plugin process
// exited) when alive is not nil.
func WaitDevices(ctx context.Context, client kubernetes.Interface, node string, n int, alive func() error) error {
	have := 0
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if alive != nil {
			if err := alive(); err != nil {
				return false, err
			}
		}
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node,
		})
		if err != nil {
			return false, err
		}
		have = 0
		for _, s := range list.Items {
			if s.Spec.Driver == driver.Name {
				have += len(s.Spec.Devices)
			}
		}
		return have == n, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d published devices of node %s (have %d): %w", n, node, have, err)
	}
	return nil
}

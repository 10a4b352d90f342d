package planner

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// BenchmarkDecideGPUsWithNICs measures one decision for a claim of 2 GPUs
// and 1 NIC with matchAttribute pcieRoot over idle pcie-switch-8 nodes
// with a NIC under each PCIe root: such pods take no shortcut, so every
// node is filtered and planned (GPUs, then the NICs of each GPU set's
// root). At 5,000 nodes it shows what a GPU+NIC pod that is no gang
// costs on a large cluster (docs/performance/gangs.md, Decision time).
func BenchmarkDecideGPUsWithNICs(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			nics := make([][]controllertest.NIC, n)
			for i := range nics {
				for r, root := range []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"} {
					nics[i] = append(nics[i], nic(fmt.Sprintf("nic-%d", r), root))
				}
			}
			p, ip, _ := nicCluster(b, nics...)
			ic, _, err := ip.Interpret(context.Background(), nicClaim("c", 2, 1, nil))
			if err != nil {
				b.Fatal(err)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
			req := Request{Pod: pod, Pending: []*Claim{ic}}
			b.ResetTimer()
			for b.Loop() {
				if d := p.Decide(context.Background(), req); d.Chosen == nil {
					b.Fatal("nothing chosen")
				}
			}
		})
	}
}

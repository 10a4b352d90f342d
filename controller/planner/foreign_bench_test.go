package planner

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
		// The first decision evaluates the selectors on every device
		// (memoised per node); both rows show the decisions after it.
		p.Decide(context.Background(), req)
		// workers=1 plans the nodes one after the other, as every
		// decision did before parallel.go; the other, with the default
		// (one worker per CPU).
		for _, workers := range []int{1, DefaultParallelism()} {
			b.Run(fmt.Sprintf("nodes=%d/workers=%d", n, workers), func(b *testing.B) {
				p.parallelism = workers
				for b.Loop() {
					if d := p.Decide(context.Background(), req); d.Chosen == nil {
						b.Fatal("nothing chosen")
					}
				}
			})
		}
	}
}

// BenchmarkWaitingGPUsWithNICs measures the decision the controller takes
// again, after every change in the cluster, for a GPU+NIC pod that fits no
// node: 3 GPUs and 1 NIC under one PCIe root, on pcie-switch-8 nodes with
// 2 GPUs per root. Between two decisions one node's usage changes (a GPU
// held on the next node in turn, the one held before released), as after
// a claim elsewhere is allocated. retry is the same pod again, after its
// first decision: the nodes that did not change keep their answer and why
// (chooseForeign). cold is a new claim each time, every node planned:
// what each retry cost before.
func BenchmarkWaitingGPUsWithNICs(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, mode := range []string{"retry", "cold"} {
			b.Run(fmt.Sprintf("nodes=%d/%s", n, mode), func(b *testing.B) {
				nics := make([][]controllertest.NIC, n)
				for i := range nics {
					for r, root := range []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"} {
						nics[i] = append(nics[i], nic(fmt.Sprintf("nic-%d", r), root))
					}
				}
				p, ip, inv := nicCluster(b, nics...)
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
				claim := func(i int) *Claim {
					ic, _, err := ip.Interpret(context.Background(), nicClaim(fmt.Sprintf("c%d", i), 3, 1, nil))
					if err != nil {
						b.Fatal(err)
					}
					return ic
				}
				ic := claim(0)
				nodes := inv.sortedNodes()
				req := Request{Pod: pod, Pending: []*Claim{ic}}
				// The pod's first decision, which plans every node, is not
				// a retry's.
				if d := p.Decide(context.Background(), req); d.Chosen != nil {
					b.Fatal("chosen")
				}
				var held types.UID
				i := 0
				b.ResetTimer()
				for b.Loop() {
					node := nodes[i%len(nodes)]
					uid := types.UID(fmt.Sprintf("elsewhere-%d", i))
					if _, ok := p.ledger.Assume(uid, []DeviceUse{{Key: DeviceKey{Pool: node.Pool, Device: node.Devices[7].Name}, Exclusive: true}}); !ok {
						b.Fatal("hold refused")
					}
					if held != "" {
						p.ledger.Forget(held)
					}
					held = uid
					if mode == "cold" {
						b.StopTimer()
						req.Pending = []*Claim{claim(i + 1)}
						b.StartTimer()
					}
					i++
					if d := p.Decide(context.Background(), req); d.Chosen != nil || len(d.Why) == 0 {
						b.Fatalf("chosen %v, %d reasons", d.Chosen != nil, len(d.Why))
					}
				}
			})
		}
	}
}

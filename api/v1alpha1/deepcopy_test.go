package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

func TestDeepCopy(t *testing.T) {
	tests := []struct {
		name string
		cfg  *GpuConfig
	}{
		{"nil", nil},
		{"empty", &GpuConfig{}},
		{"full", &GpuConfig{
			Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NV1"},
			Sharing:  &SharingConfig{Strategy: SharingMPS, DefaultMemory: quantity("4Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16), Priority: ptr(PriorityLow)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := tt.cfg.DeepCopy()
			if tt.cfg == nil {
				if cp != nil {
					t.Fatalf("DeepCopy(nil) = %+v", cp)
				}
				if obj := tt.cfg.DeepCopyObject(); obj != nil {
					t.Fatalf("DeepCopyObject(nil) = %#v, want untyped nil", obj)
				}
				return
			}
			if cp == tt.cfg {
				t.Fatal("DeepCopy returned its receiver")
			}
			assertConfigEqual(t, cp, tt.cfg)
			var obj runtime.Object = tt.cfg
			if _, ok := obj.DeepCopyObject().(*GpuConfig); !ok {
				t.Fatalf("DeepCopyObject returned %T", obj.DeepCopyObject())
			}
			if cp.Topology != nil {
				cp.Topology.MinLink = "SYS"
				if tt.cfg.Topology.MinLink == "SYS" {
					t.Error("copy shares Topology with the original")
				}
			}
			if cp.Sharing != nil {
				*cp.Sharing.DefaultCores = 1
				*cp.Sharing.MaxSharesPerGPU = 1
				*cp.Sharing.Priority = 7
				cp.Sharing.DefaultMemory.Set(1)
				if *tt.cfg.Sharing.DefaultCores == 1 || *tt.cfg.Sharing.MaxSharesPerGPU == 1 || tt.cfg.Sharing.DefaultMemory.Value() == 1 || *tt.cfg.Sharing.Priority == 7 {
					t.Error("copy shares Sharing fields with the original")
				}
			}
		})
	}
}

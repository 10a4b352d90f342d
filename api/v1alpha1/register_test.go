package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

func TestAddToScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatalf("AddToScheme: %v", err)
	}
	kinds, _, err := scheme.ObjectKinds(&GpuConfig{})
	if err != nil {
		t.Fatalf("ObjectKinds: %v", err)
	}
	if len(kinds) != 1 || kinds[0].Group != GroupName || kinds[0].Version != Version || kinds[0].Kind != Kind {
		t.Errorf("kinds = %v, want %s/%s %s", kinds, GroupName, Version, Kind)
	}
	obj, err := scheme.New(SchemeGroupVersion.WithKind(Kind))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, ok := obj.(*GpuConfig); !ok {
		t.Errorf("scheme.New returned %T", obj)
	}
}

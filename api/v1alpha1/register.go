package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the group and version of GpuConfig, for callers that
// keep GpuConfig in a runtime.Scheme of their own.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// AddToScheme registers GpuConfig with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(SchemeGroupVersion.WithKind(Kind), &GpuConfig{})
	return nil
}

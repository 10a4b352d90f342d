package controller

import "k8s.io/apimachinery/pkg/api/meta"

// stripManagedFields drops managedFields from objects as the informers
// store them: nothing here reads them, and they are a large part of each
// cached Node, ResourceSlice and Pod (measured by test/scale). Updates
// built from cached objects then carry no managedFields, which the API
// server reads as "unchanged".
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

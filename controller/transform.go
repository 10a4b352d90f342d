package controller

import (
	"unique"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// transformObject is the informers' transform: stripManagedFields, and
// internSlice for ResourceSlices.
func transformObject(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	if err != nil {
		return obj, err
	}
	if s, ok := obj.(*resourceapi.ResourceSlice); ok {
		internSlice(s)
	}
	return obj, nil
}

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

// internSlice makes the strings that repeat across the slices of a
// cluster (attribute and capacity names, device names, product names,
// the link rows nodes of one kind share, taints) point to one copy each,
// so that the informer's cache and the inventory, which refers to the
// cached maps, hold them once rather than once per node. Values are
// unchanged; only where their bytes live.
func internSlice(s *resourceapi.ResourceSlice) {
	s.Spec.Driver = intern(s.Spec.Driver)
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		d.Name = intern(d.Name)
		if d.Attributes != nil {
			attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
			for k, v := range d.Attributes {
				if v.StringValue != nil {
					v.StringValue = internPtr(*v.StringValue)
				}
				if v.VersionValue != nil {
					v.VersionValue = internPtr(*v.VersionValue)
				}
				attrs[resourceapi.QualifiedName(intern(string(k)))] = v
			}
			d.Attributes = attrs
		}
		if d.Capacity != nil {
			caps := make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(d.Capacity))
			for k, v := range d.Capacity {
				caps[resourceapi.QualifiedName(intern(string(k)))] = v
			}
			d.Capacity = caps
		}
		for j := range d.Taints {
			t := &d.Taints[j]
			t.Key, t.Value = intern(t.Key), intern(t.Value)
		}
	}
}

func intern(s string) string { return unique.Make(s).Value() }

// internPtr returns a new pointer to the interned string: the pointer is
// per value, the bytes are shared.
func internPtr(s string) *string {
	v := intern(s)
	return &v
}

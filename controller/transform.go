package controller

import (
	"strings"
	"sync"

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
			d.Capacity = internCapacity(d.Capacity)
		}
		for j := range d.Taints {
			t := &d.Taints[j]
			t.Key, t.Value = intern(t.Key), intern(t.Value)
		}
	}
}

// internMax bounds the intern table. Strings unique to one node (UUIDs,
// PCI bus IDs) take entries too; the strings worth sharing (names, product
// names, the link rows of each node kind) are met with the first nodes,
// long before the bound. 64Ki entries of short strings are a few MiB.
const internMax = 1 << 16

// interned holds one copy of each string internSlice has met. It is the
// controller's own table rather than package unique's: a unique.Handle
// that is not kept lets its canonical copy be collected, after which the
// next slice gets a copy of its own again.
var interned = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// intern returns the table's copy of s, adding a copy of its own (not
// pinning the decoder's buffer) while the table has room.
func intern(s string) string {
	interned.Lock()
	defer interned.Unlock()
	if v, ok := interned.m[s]; ok {
		return v
	}
	if len(interned.m) >= internMax {
		return s
	}
	s = strings.Clone(s)
	interned.m[s] = s
	return s
}

// internPtr returns a new pointer to the interned string: the pointer is
// per value, the bytes are shared.
func internPtr(s string) *string {
	v := intern(s)
	return &v
}

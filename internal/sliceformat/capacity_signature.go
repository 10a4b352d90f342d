package sliceformat

import (
	"encoding/binary"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// CapacitySignature renders a device's capacities (names, values and
// request policies) as one string: two devices with the same signature
// publish the same capacities, so that what is derived from them alone (a
// share's consumption) may be computed once for all of them, and the
// controller's cache may hold one copy of them. The values are rendered
// in their protobuf encoding, which is deterministic for these types and
// follows the API's fields as they grow; ok is false when one does not
// encode, and the capacities then have no signature.
func CapacitySignature(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) (sig string, ok bool) {
	names := make([]resourceapi.QualifiedName, 0, len(caps))
	for name := range caps {
		names = append(names, name)
	}
	slices.Sort(names)
	var b []byte
	for _, name := range names {
		c := caps[name]
		enc, err := c.Marshal()
		if err != nil {
			return "", false
		}
		// Names cannot hold NUL, and each value is length-prefixed, so
		// no two different maps render alike.
		b = append(b, name...)
		b = append(b, 0)
		b = binary.AppendUvarint(b, uint64(len(enc)))
		b = append(b, enc...)
	}
	return string(b), true
}

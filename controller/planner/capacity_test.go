package planner

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }

func TestConsumption(t *testing.T) {
	ranged := resourceapi.DeviceCapacity{Value: resource.MustParse("32Gi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default: q("4Gi"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("256Mi"), Max: q("16Gi"), Step: q("256Mi")}}}
	values := resourceapi.DeviceCapacity{Value: resource.MustParse("100"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default: q("25"), ValidValues: []resource.Quantity{resource.MustParse("50"), resource.MustParse("25"), resource.MustParse("100")}}}
	bare := resourceapi.DeviceCapacity{Value: resource.MustParse("100")}
	for _, tc := range []struct {
		name    string
		req     *resource.Quantity
		cap     resourceapi.DeviceCapacity
		want    int64
		wantErr string
	}{
		{"default", nil, ranged, 4 << 30, ""},
		{"below min", q("1Mi"), ranged, 256 << 20, ""},
		{"round up to step", q("1000Mi"), ranged, 1 << 30, ""},
		{"exact step", q("2Gi"), ranged, 2 << 30, ""},
		{"above max", q("17Gi"), ranged, 0, "above the device's maximum"},
		{"valid values round up", q("30"), values, 50, ""},
		{"valid values exact", q("25"), values, 25, ""},
		{"above valid values", q("101"), values, 0, "above every valid value"},
		{"no policy, no request: whole", nil, bare, 100, ""},
		{"no policy: as requested", q("7"), bare, 7, ""},
		{"more than the device", q("200"), bare, 0, "more than the device has"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := consumption(tc.req, tc.cap)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("consumption = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

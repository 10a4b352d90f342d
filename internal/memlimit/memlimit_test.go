package memlimit

import (
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	const mi = int64(1) << 20
	for _, tc := range []struct {
		name      string
		env       map[string]string
		wantLimit int64
		wantErr   string
	}{
		{name: "the chart's default limit", env: map[string]string{EnvContainerLimit: "1610612736"}, wantLimit: 1536 * mi / 100 * 90},
		{name: "no container limit given", env: map[string]string{}},
		{name: "GOMEMLIMIT stands", env: map[string]string{EnvContainerLimit: "1610612736", "GOMEMLIMIT": "1GiB"}},
		{name: "a quantity with a unit", env: map[string]string{EnvContainerLimit: "1536Mi"}, wantErr: `GPULINK_CONTAINER_MEMORY_LIMIT="1536Mi"`},
		{name: "zero", env: map[string]string{EnvContainerLimit: "0"}, wantErr: `GPULINK_CONTAINER_MEMORY_LIMIT="0"`},
		{name: "negative", env: map[string]string{EnvContainerLimit: "-5"}, wantErr: `GPULINK_CONTAINER_MEMORY_LIMIT="-5"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set []int64
			res, err := Apply(func(k string) string { return tc.env[k] }, func(v int64) int64 { set = append(set, v); return 0 })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				if len(set) != 0 {
					t.Fatalf("a bad value set the limit to %v", set)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantLimit == 0 {
				if len(set) != 0 || res.LimitBytes != 0 || res.Reason == "" {
					t.Fatalf("set %v, result %+v: want nothing set and a reason", set, res)
				}
				return
			}
			if len(set) != 1 || set[0] != tc.wantLimit || res.LimitBytes != tc.wantLimit {
				t.Fatalf("set %v, result %+v: want the limit %d once", set, res, tc.wantLimit)
			}
		})
	}
}

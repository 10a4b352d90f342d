package kubeclient

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestSetContentType(t *testing.T) {
	for _, tc := range []struct {
		in, wantType, wantAccept, wantErr string
	}{
		{in: "application/vnd.kubernetes.protobuf", wantType: "application/vnd.kubernetes.protobuf", wantAccept: "application/vnd.kubernetes.protobuf,application/json"},
		{in: "application/json", wantType: "application/json", wantAccept: "application/json"},
		{in: "application/yaml", wantErr: `--kube-api-content-type "application/yaml": want application/vnd.kubernetes.protobuf or application/json`},
		{in: "", wantErr: `--kube-api-content-type ""`},
	} {
		cfg := &rest.Config{}
		err := SetContentType(cfg, tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("SetContentType(%q) = %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
			if cfg.ContentType != "" || cfg.AcceptContentTypes != "" {
				t.Errorf("SetContentType(%q) failed but changed the config: %+v", tc.in, cfg.ContentConfig)
			}
			continue
		}
		if err != nil {
			t.Errorf("SetContentType(%q): %v", tc.in, err)
			continue
		}
		if cfg.ContentType != tc.wantType || cfg.AcceptContentTypes != tc.wantAccept {
			t.Errorf("SetContentType(%q): content type %q, accept %q; want %q, %q", tc.in, cfg.ContentType, cfg.AcceptContentTypes, tc.wantType, tc.wantAccept)
		}
	}
}

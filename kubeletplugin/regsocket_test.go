package kubeletplugin

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestCheckRegistrarSocket(t *testing.T) {
	const uid = types.UID("4333b23c-fd5e-4909-a260-483a093001d0")
	// "<dir>/gpu.gpulink.dev-<uid>-reg.sock" is len(dir) + 62 bytes.
	dirOf := func(n int) string { return "/" + strings.Repeat("d", n-1) }
	for _, tc := range []struct {
		name    string
		dir     string
		uid     types.UID
		wantErr bool
	}{
		{name: "the default kubelet root", dir: "/var/lib/kubelet/plugins_registry", uid: uid},
		{name: "no rolling update", dir: dirOf(46)},
		{name: "107 bytes with the full UID", dir: dirOf(45), uid: uid},
		// The helper keeps the full UID at 108 bytes, which bind refuses.
		{name: "108 bytes with the full UID", dir: dirOf(46), uid: uid, wantErr: true},
		// From 109 bytes the helper hashes the UID: a shorter name.
		{name: "a hashed name", dir: dirOf(47), uid: uid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRegistrarSocket(tc.dir, tc.uid)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkRegistrarSocket(%q) = %v, want error %v", tc.dir, err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tc.dir) {
				t.Errorf("the error does not name the directory: %v", err)
			}
		})
	}
}

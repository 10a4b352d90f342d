package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMkdirTempAvoidsTheSocketLimit(t *testing.T) {
	// "/tmp/glconf" + 8 digits: "<dir>/c/kubelet/plugins_registry" is 46
	// bytes, and the socket path 108.
	if !registryAtLimit("/tmp/glconf12345678") {
		t.Error("a directory whose registration socket path is 108 bytes not caught")
	}
	// A 9-digit suffix: 109 bytes under c/ (the helper hashes the UID),
	// 107 without (it fits).
	if registryAtLimit("/tmp/glconf123456789") {
		t.Error("a directory whose registration socket paths are 107 and 109 bytes refused")
	}
	// A 10-digit one is at the limit for a cluster in the directory itself.
	if !registryAtLimit("/tmp/glconf1234567890") {
		t.Error("a directory whose cluster's registration socket path is 108 bytes not caught")
	}
	for _, prefix := range []string{"glconf", "glhelm", "lc-", "gl", "glkr", "glmig", strings.Repeat("p", 9)} {
		dir, err := MkdirTemp(prefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(filepath.Base(dir), prefix) || registryAtLimit(dir) {
			t.Fatalf("MkdirTemp gave %s", dir)
		}
	}
}

package localcluster

import (
	"context"
	"strings"
	"testing"
)

func TestBuildProductImageRejectsBadTags(t *testing.T) {
	for _, tag := range []string{"", "a:b", "a/b", "a b"} {
		_, _, err := BuildProductImage(context.Background(), tag)
		if err == nil || !strings.Contains(err.Error(), "image tag") {
			t.Errorf("tag %q: err = %v, want an image tag error", tag, err)
		}
	}
}

package controller

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestClaimVersions(t *testing.T) {
	at := func(rv string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: "u", ResourceVersion: rv}}
	}
	v := newClaimVersions()
	if v.behind(at("5")) {
		t.Fatal("a claim never seen live is behind")
	}
	v.saw(at("10"))
	v.saw(at("8")) // an older live copy does not lower the mark
	for _, rv := range []string{"5", "9"} {
		if !v.behind(at(rv)) {
			t.Errorf("cached version %s is not behind 10", rv)
		}
	}
	v.observe(at("7"))
	if !v.behind(at("9")) {
		t.Error("an older informer copy cleared the mark")
	}
	v.observe(at("10"))
	if v.behind(at("9")) {
		t.Error("the mark stayed after the informer delivered version 10")
	}
	if len(v.seen) != 0 {
		t.Errorf("records left: %v", v.seen)
	}
	v.saw(at("12"))
	v.forget("u")
	if v.behind(at("1")) || len(v.seen) != 0 {
		t.Error("a deleted claim's record stayed")
	}
	v.saw(at("not-a-number"))
	if v.behind(at("3")) {
		t.Error("an unparsable version must not hold pods back (the informer's view wins)")
	}
}

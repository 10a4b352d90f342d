package kubeletplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The instance is ready only after the kubelet's successful registration
// notification went through the helper; a failed one, a rejected one and
// other calls leave it unready, and a ready file left by an earlier
// container is removed before the plugin starts.
func TestRegistrationMakesReady(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Driver{opts: Options{ReadyFile: ready}}
	if err := d.resetRegistration(); err != nil {
		t.Fatal(err)
	}
	if err := CheckReadyFile(ready); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("ready file of an earlier container kept: CheckReadyFile = %v", err)
	}

	notify := &grpc.UnaryServerInfo{FullMethod: registerapi.Registration_NotifyRegistrationStatus_FullMethodName}
	getInfo := &grpc.UnaryServerInfo{FullMethod: registerapi.Registration_GetInfo_FullMethodName}
	ok := func(context.Context, any) (any, error) { return &registerapi.RegistrationStatusResponse{}, nil }
	rejected := errors.New("failed registration process")
	fail := func(context.Context, any) (any, error) { return nil, rejected }
	for _, c := range []struct {
		name    string
		info    *grpc.UnaryServerInfo
		req     any
		handler grpc.UnaryHandler
		wantErr error
	}{
		{"GetInfo", getInfo, &registerapi.InfoRequest{}, ok, nil},
		{"kubelet reports failure", notify, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version"}, fail, rejected},
		{"helper refuses the notification", notify, &registerapi.RegistrationStatus{PluginRegistered: true}, fail, rejected},
	} {
		if _, err := d.watchRegistration(t.Context(), c.req, c.info, c.handler); !errors.Is(err, c.wantErr) {
			t.Errorf("%s: error %v, want %v passed through", c.name, err, c.wantErr)
		}
		if d.Registered() || CheckReadyFile(ready) == nil {
			t.Fatalf("%s made the instance ready", c.name)
		}
	}
	if _, err := d.watchRegistration(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}, notify, ok); err != nil {
		t.Fatal(err)
	}
	if !d.Registered() {
		t.Error("Registered() = false after a successful registration")
	}
	if err := CheckReadyFile(ready); err != nil {
		t.Errorf("CheckReadyFile after a successful registration: %v", err)
	}

	d.unregistered(t.Context())
	if d.Registered() || CheckReadyFile(ready) == nil {
		t.Error("still ready after Run ended")
	}
	if err := CheckReadyFile(""); err == nil || !strings.Contains(err.Error(), "--ready-file") {
		t.Errorf("CheckReadyFile(\"\") = %v, want an error naming --ready-file", err)
	}
}

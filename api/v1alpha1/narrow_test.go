package v1alpha1

import (
	"strings"
	"testing"
)

func TestClaimMayOnlyNarrowTheClass(t *testing.T) {
	const head = "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n"
	sharing := func(s string) string { return head + "sharing: " + s + "\n" }
	mps8 := sharing("{strategy: MPS, maxSharesPerGPU: 8}")
	tests := []struct {
		name  string
		class []string
		claim []string
		// wantErr lists what the error must mention; empty means the
		// layers are accepted.
		wantErr []string
		// wantStrategy and wantMax are the resolved values when accepted.
		wantStrategy SharingStrategy
		wantMax      int
	}{
		{name: "no claim layer", class: []string{mps8}, wantStrategy: SharingMPS, wantMax: 8},
		{name: "claim repeats the class's strategy", class: []string{mps8}, claim: []string{sharing("{strategy: MPS}")},
			wantStrategy: SharingMPS, wantMax: 8},
		{name: "claim lowers maxSharesPerGPU", class: []string{mps8}, claim: []string{sharing("{maxSharesPerGPU: 2}")},
			wantStrategy: SharingMPS, wantMax: 2},
		{name: "claim keeps maxSharesPerGPU", class: []string{mps8}, claim: []string{sharing("{maxSharesPerGPU: 8}")},
			wantStrategy: SharingMPS, wantMax: 8},
		{name: "claim lowers the default cap", claim: []string{sharing("{maxSharesPerGPU: 4}")},
			wantStrategy: SharingMPS, wantMax: 4},
		{name: "claim sets its own share sizes and topology",
			class:        []string{mps8},
			claim:        []string{head + "topology: {policy: Required, minLink: NV1}\nsharing: {defaultMemory: 30Gi, defaultCores: 100}\n"},
			wantStrategy: SharingMPS, wantMax: 8},
		// HAMi lets every pod pick its task priority; MPS orders only a
		// claim's own clients with it, so it is the claim's choice.
		{name: "claim raises its priority over the class's", class: []string{sharing("{strategy: MPS, maxSharesPerGPU: 8, priority: 1}")},
			claim: []string{sharing("{priority: 0}")}, wantStrategy: SharingMPS, wantMax: 8},
		{name: "class picks HAMiCore, claim repeats it", class: []string{sharing("{strategy: HAMiCore}")},
			claim: []string{sharing("{strategy: HAMiCore}")}, wantStrategy: SharingHAMiCore, wantMax: DefaultMaxSharesPerGPU},
		{name: "later class layer raises the cap", class: []string{mps8, sharing("{maxSharesPerGPU: 32}")},
			claim: []string{sharing("{maxSharesPerGPU: 32}")}, wantStrategy: SharingMPS, wantMax: 32},
		{name: "class None, claim None", class: []string{sharing("{strategy: None}")}, claim: []string{sharing("{strategy: None}")},
			wantStrategy: SharingNone},

		{name: "claim picks HAMiCore over the class's MPS", class: []string{mps8}, claim: []string{sharing("{strategy: HAMiCore}")},
			wantErr: []string{"sharing.strategy", "Forbidden", "claim sets HAMiCore", "strategy is MPS (the DeviceClass's)"}},
		{name: "claim picks HAMiCore over the default", claim: []string{sharing("{strategy: HAMiCore}")},
			wantErr: []string{"sharing.strategy", "claim sets HAMiCore", "strategy is MPS (the default)"}},
		{name: "claim switches enforcement off", class: []string{mps8}, claim: []string{sharing("{strategy: None}")},
			wantErr: []string{"sharing.strategy", "claim sets None", "strategy is MPS"}},
		{name: "claim turns a whole-GPU class into shares", class: []string{sharing("{strategy: None}")}, claim: []string{sharing("{strategy: MPS}")},
			wantErr: []string{"sharing.strategy", "claim sets MPS", "strategy is None (the DeviceClass's)"}},
		{name: "claim raises maxSharesPerGPU", class: []string{mps8}, claim: []string{sharing("{maxSharesPerGPU: 100}")},
			wantErr: []string{"sharing.maxSharesPerGPU", "claim sets 100", "at most 8", "(the DeviceClass's)"}},
		{name: "claim raises the default cap", claim: []string{sharing("{maxSharesPerGPU: 17}")},
			wantErr: []string{"sharing.maxSharesPerGPU", "claim sets 17", "at most 16", "(the default)"}},
		{name: "a later claim layer widens what an earlier narrowed",
			class: []string{mps8}, claim: []string{sharing("{maxSharesPerGPU: 2}"), sharing("{maxSharesPerGPU: 9}")},
			wantErr: []string{"sharing.maxSharesPerGPU", "claim sets 9", "at most 8"}},
		{name: "both at once are reported", class: []string{mps8}, claim: []string{sharing("{strategy: HAMiCore, maxSharesPerGPU: 50}")},
			wantErr: []string{"sharing.strategy", "sharing.maxSharesPerGPU", "claim sets 50"}},
		{name: "a claim cannot repair a broken class cap", class: []string{sharing("{maxSharesPerGPU: 500}")}, claim: []string{sharing("{maxSharesPerGPU: 100}")},
			wantErr: []string{"invalid DeviceClass GpuConfig", "sharing.maxSharesPerGPU", "500"}},
		{name: "class opts in to memory over-commit, claim lowers it", class: []string{sharing("{memoryOvercommitPercent: 200}")},
			claim: []string{sharing("{memoryOvercommitPercent: 150}")}, wantStrategy: SharingMPS, wantMax: DefaultMaxSharesPerGPU},
		{name: "claim over-commits memory without the class's opt-in", claim: []string{sharing("{memoryOvercommitPercent: 150}")},
			wantErr: []string{"sharing.memoryOvercommitPercent", "claim sets 150", "allows 100%", "(the default)"}},
		{name: "claim over-commits more than the class", class: []string{sharing("{memoryOvercommitPercent: 120}")}, claim: []string{sharing("{memoryOvercommitPercent: 150}")},
			wantErr: []string{"sharing.memoryOvercommitPercent", "claim sets 150", "allows 120%", "(the DeviceClass's)"}},
		{name: "lowering below 1 is still invalid", class: []string{mps8}, claim: []string{sharing("{maxSharesPerGPU: 0}")},
			wantErr: []string{"sharing.maxSharesPerGPU", "must be between 1 and 100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(raw(tt.class), raw(tt.claim))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Resolve accepted the claim: %+v", got.Sharing)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got.Sharing.Strategy != tt.wantStrategy {
				t.Errorf("strategy %s, want %s", got.Sharing.Strategy, tt.wantStrategy)
			}
			switch m := got.Sharing.MaxSharesPerGPU; {
			case tt.wantMax == 0 && m != nil:
				t.Errorf("maxSharesPerGPU %d, want unset", *m)
			case tt.wantMax != 0 && (m == nil || *m != tt.wantMax):
				t.Errorf("maxSharesPerGPU %v, want %d", m, tt.wantMax)
			}
		})
	}
}

// The claim's layers are checked, not the class's: the same settings are
// fine from a DeviceClass.
func TestCheckClaimNarrowsTrustsTheClass(t *testing.T) {
	cfgs, err := DecodeLayers([]byte("apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {strategy: HAMiCore, maxSharesPerGPU: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckClaimNarrows(cfgs, nil); err != nil {
		t.Errorf("class layer refused: %v", err)
	}
	if err := CheckClaimNarrows(nil, cfgs); err == nil {
		t.Error("the same settings accepted from a claim")
	}
}

// Only a DeviceClass chooses the MPS mode: a claim may repeat its class's
// effective mode (the default Isolated included) and nothing else, and the
// resolved configuration says which mode the request's shares get.
func TestClaimMayOnlyRepeatTheMPSMode(t *testing.T) {
	const head = "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n"
	sharing := func(s string) string { return head + "sharing: " + s + "\n" }
	concurrent := sharing("{strategy: MPS, mpsMode: Concurrent}")
	tests := []struct {
		name         string
		class, claim []string
		wantErr      []string
		want         MPSMode
	}{
		{name: "default class is Isolated", want: MPSIsolated},
		{name: "Concurrent class", class: []string{concurrent}, want: MPSConcurrent},
		{name: "mode alone implies MPS", class: []string{sharing("{mpsMode: Concurrent}")}, want: MPSConcurrent},
		{name: "claim repeats Concurrent", class: []string{concurrent}, claim: []string{sharing("{mpsMode: Concurrent}")}, want: MPSConcurrent},
		{name: "claim repeats the default", claim: []string{sharing("{mpsMode: Isolated}")}, want: MPSIsolated},
		{name: "later class layer turns it back", class: []string{concurrent, sharing("{mpsMode: Isolated}")}, want: MPSIsolated},
		{name: "HAMiCore class has no mode", class: []string{sharing("{strategy: HAMiCore}")}},

		{name: "claim asks Concurrent of an Isolated class", class: []string{sharing("{mpsMode: Isolated}")}, claim: []string{sharing("{mpsMode: Concurrent}")},
			wantErr: []string{"sharing.mpsMode", "Forbidden", "claim sets Concurrent", "MPS mode is Isolated (the DeviceClass's)"}},
		{name: "claim asks Concurrent of the default", claim: []string{sharing("{mpsMode: Concurrent}")},
			wantErr: []string{"sharing.mpsMode", "claim sets Concurrent", "MPS mode is Isolated (the default)", "only the DeviceClass chooses it"}},
		{name: "claim asks Isolated of a Concurrent class", class: []string{concurrent}, claim: []string{sharing("{mpsMode: Isolated}")},
			wantErr: []string{"sharing.mpsMode", "claim sets Isolated", "MPS mode is Concurrent (the DeviceClass's)"}},
		{name: "claim sets a mode under HAMiCore", class: []string{sharing("{strategy: HAMiCore}")}, claim: []string{sharing("{mpsMode: Isolated}")},
			wantErr: []string{"sharing.mpsMode", "claim sets Isolated", "sharing.strategy HAMiCore has no MPS mode"}},
		{name: "claim's unknown mode is named with the known ones", claim: []string{sharing("{mpsMode: Shared}")},
			wantErr: []string{`sharing.mpsMode: Unsupported value: "Shared": supported values: "Isolated", "Concurrent"`}},
		{name: "class sets a mode under HAMiCore", class: []string{sharing("{strategy: HAMiCore, mpsMode: Concurrent}")},
			wantErr: []string{`sharing.mpsMode: Invalid value: "Concurrent": applies to sharing.strategy MPS only, not HAMiCore`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(raw(tt.class), raw(tt.claim))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Resolve accepted it: %+v", got.Sharing)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got.Sharing.MPSMode != tt.want {
				t.Errorf("mpsMode %q, want %q", got.Sharing.MPSMode, tt.want)
			}
			if c := got.ConcurrentMPS(); c != (tt.want == MPSConcurrent) {
				t.Errorf("ConcurrentMPS() = %v with mode %q", c, got.Sharing.MPSMode)
			}
		})
	}
}

func TestConcurrentMPS(t *testing.T) {
	for _, tt := range []struct {
		cfg  *GpuConfig
		want bool
	}{
		{nil, false},
		{&GpuConfig{}, false},
		{&GpuConfig{Sharing: &SharingConfig{Strategy: SharingMPS, MPSMode: MPSConcurrent}}, true},
		{&GpuConfig{Sharing: &SharingConfig{Strategy: SharingMPS, MPSMode: MPSIsolated}}, false},
		// Not defaulted: the strategy is unknown, so not (yet) Concurrent.
		{&GpuConfig{Sharing: &SharingConfig{MPSMode: MPSConcurrent}}, false},
		{&GpuConfig{Sharing: &SharingConfig{Strategy: SharingHAMiCore, MPSMode: MPSConcurrent}}, false},
	} {
		if got := tt.cfg.ConcurrentMPS(); got != tt.want {
			t.Errorf("ConcurrentMPS(%+v) = %v, want %v", tt.cfg, got, tt.want)
		}
	}
}

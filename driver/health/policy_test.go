package health

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	p := DefaultPolicy()
	custom := Policy{FatalXIDs: []uint64{13}, IgnoredXIDs: []uint64{79}}
	for _, tc := range []struct {
		name   string
		policy Policy
		event  Event
		want   Verdict
	}{
		{"fallen off the bus", p, Event{Kind: KindXID, XID: 79}, Fatal},
		{"double-bit ECC XID", p, Event{Kind: KindXID, XID: 48}, Fatal},
		{"NVLink error", p, Event{Kind: KindXID, XID: 74}, Fatal},
		{"GSP timeout", p, Event{Kind: KindXID, XID: 119}, Fatal},
		{"contained ECC", p, Event{Kind: KindXID, XID: 94}, Fatal},
		{"graphics exception is the application's", p, Event{Kind: KindXID, XID: 13}, Ignored},
		{"page fault is the application's", p, Event{Kind: KindXID, XID: 31}, Ignored},
		{"stopped processing", p, Event{Kind: KindXID, XID: 43}, Ignored},
		{"preemptive cleanup", p, Event{Kind: KindXID, XID: 45}, Ignored},
		{"video processor exception", p, Event{Kind: KindXID, XID: 68}, Ignored},
		{"unknown XID is a warning", p, Event{Kind: KindXID, XID: 8}, Warning},
		{"double-bit ECC event", p, Event{Kind: KindECCDoubleBit}, Fatal},
		{"GPU lost", p, Event{Kind: KindGPULost}, Fatal},
		{"row remap failure", p, Event{Kind: KindRowRemapFailure}, Fatal},
		{"thermal slowdown", p, Event{Kind: KindThermal}, Warning},
		{"recovered", p, Event{Kind: KindRecovered}, Recovered},
		{"configured fatal", custom, Event{Kind: KindXID, XID: 13}, Fatal},
		{"configured ignored", custom, Event{Kind: KindXID, XID: 79}, Ignored},
		{"empty lists: every XID a warning", Policy{}, Event{Kind: KindXID, XID: 79}, Warning},
		{"GPU lost is fatal whatever the XID lists", custom, Event{Kind: KindGPULost}, Fatal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.policy.Classify(tc.event); got != tc.want {
				t.Errorf("Classify(%+v) = %s, want %s", tc.event, got, tc.want)
			}
		})
	}
}

func TestDefaultListsDisjoint(t *testing.T) {
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	err := Policy{FatalXIDs: []uint64{48, 13}, IgnoredXIDs: []uint64{13}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "XID 13") {
		t.Fatalf("Validate of overlapping lists = %v, want an error naming XID 13", err)
	}
}

func TestParseXIDs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []uint64
		wantErr string
	}{
		{"", nil, ""},
		{"79", []uint64{79}, ""},
		{" 48, 79 ,48", []uint64{48, 79}, ""},
		{FormatXIDs(DefaultFatalXIDs), DefaultFatalXIDs, ""},
		{"48,x", nil, `"x" is not an XID number`},
		{"0", nil, `"0" is not an XID number`},
		{"48,,79", nil, `"" is not an XID number`},
		{"-1", nil, `"-1"`},
	} {
		got, err := ParseXIDs("--health-fatal-xids", tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--health-fatal-xids") {
				t.Errorf("ParseXIDs(%q) error = %v, want one naming the flag and containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseXIDs(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range kinds {
		if got, err := ParseKind(string(k)); err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	if _, err := ParseKind("on-fire"); err == nil || !strings.Contains(err.Error(), `"on-fire"`) || !strings.Contains(err.Error(), "gpu-lost") {
		t.Errorf("ParseKind(on-fire) error = %v, want one naming the value and the valid kinds", err)
	}
}

func TestTracker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		event      Event
		verdict    Verdict
		transition Transition
		reason     string // gpu-0's reason after the step
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		name: "fatal XID taints, operator clear heals",
		steps: []step{
			{Event{Device: "gpu-0", Kind: KindXID, XID: 79, Time: at(1)}, Fatal, BecameUnhealthy, "xid-79"},
			{Event{Device: "gpu-0", Kind: KindXID, XID: 79, Time: at(2)}, Fatal, Unchanged, "xid-79"},
			{Event{Device: "gpu-0", Kind: KindRecovered, Time: at(3)}, Recovered, BecameHealthy, ""},
		},
	}, {
		name: "application XID and thermal leave the GPU healthy",
		steps: []step{
			{Event{Device: "gpu-0", Kind: KindXID, XID: 13}, Ignored, Unchanged, ""},
			{Event{Device: "gpu-0", Kind: KindThermal}, Warning, Unchanged, ""},
			{Event{Device: "gpu-0", Kind: KindXID, XID: 8}, Warning, Unchanged, ""},
		},
	}, {
		name: "GPU answering again clears only gpu-lost",
		steps: []step{
			{Event{Device: "gpu-0", Kind: KindGPULost, Time: at(1)}, Fatal, BecameUnhealthy, "gpu-lost"},
			{Event{Device: "gpu-0", Kind: KindECCDoubleBit, Time: at(2)}, Fatal, StillUnhealthy, "gpu-lost"},
			{Event{Device: "gpu-0", Kind: KindRecovered, Condition: "gpu-lost", Time: at(3)}, Recovered, StillUnhealthy, "ecc-dbe"},
			{Event{Device: "gpu-0", Kind: KindRecovered, Condition: "gpu-lost", Time: at(4)}, Recovered, Unchanged, "ecc-dbe"},
			{Event{Device: "gpu-0", Kind: KindRecovered, Condition: "ecc-dbe", Time: at(5)}, Recovered, BecameHealthy, ""},
		},
	}, {
		name: "recovery of a healthy GPU changes nothing",
		steps: []step{
			{Event{Device: "gpu-0", Kind: KindRecovered}, Recovered, Unchanged, ""},
		},
	}, {
		name: "other GPUs are independent",
		steps: []step{
			{Event{Device: "gpu-1", Kind: KindRowRemapFailure, Time: at(1)}, Fatal, BecameUnhealthy, ""},
			{Event{Device: "gpu-0", Kind: KindRecovered}, Recovered, Unchanged, ""},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(DefaultPolicy())
			for i, s := range tc.steps {
				v, tn := tr.Apply(s.event)
				if v != s.verdict || tn != s.transition {
					t.Fatalf("step %d %+v: got %s/%s, want %s/%s", i, s.event, v, tn, s.verdict, s.transition)
				}
				st := tr.State("gpu-0")
				if r, _ := st.Reason(); r != s.reason || st.Healthy() != (s.reason == "") {
					t.Fatalf("step %d: gpu-0 reason %q healthy %v, want reason %q", i, r, st.Healthy(), s.reason)
				}
			}
		})
	}
}

func TestTrackerKeepsFirstTimeAndRestores(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(DefaultPolicy())
	tr.Apply(Event{Device: "gpu-2", Kind: KindXID, XID: 48, Time: t0})
	tr.Apply(Event{Device: "gpu-2", Kind: KindXID, XID: 48, Time: t0.Add(time.Hour)})
	un := tr.Unhealthy()
	if len(un) != 1 || !un["gpu-2"].Conditions["xid-48"].Equal(t0) {
		t.Fatalf("Unhealthy() = %v, want gpu-2 xid-48 since %v", un, t0)
	}
	other := NewTracker(DefaultPolicy())
	other.Restore("gpu-2", un["gpu-2"].Conditions)
	if r, at := other.State("gpu-2").Reason(); r != "xid-48" || !at.Equal(t0) {
		t.Fatalf("restored reason %q at %v", r, at)
	}
	other.Restore("gpu-2", nil)
	if !other.State("gpu-2").Healthy() {
		t.Fatal("Restore(nil) left gpu-2 unhealthy")
	}
}

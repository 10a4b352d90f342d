package cli

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

type strictInner struct {
	Count *int               `json:"count,omitempty"`
	Size  *resource.Quantity `json:"size,omitempty"`
	Flag  bool               `json:"flag,omitempty"`
	Ratio float64            `json:"ratio,omitempty"`
	Tiny  int8               `json:"tiny,omitempty"`
}

type strictEmbedded struct {
	Shared string `json:"shared,omitempty"`
}

type strictDoc struct {
	strictEmbedded
	Name  string        `json:"name"`
	Items []strictInner `json:"items"`
	Skip  string        `json:"-"`
}

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want []string // substrings of the error; none means success
	}{
		{name: "valid yaml", raw: "name: a\nshared: s\nitems:\n- {count: 2, size: 1Gi, flag: true, ratio: 0.5, tiny: -3}\n"},
		{name: "valid json", raw: `{"name":"a","items":[{"count":2}]}`},
		{name: "nulls are zero values", raw: "name: a\nitems:\n- {count: null, size: null}\n"},
		{name: "unknown nested field with index", raw: "name: a\nitems:\n- {count: 1}\n- {cuont: 2}\n", want: []string{"items[1].cuont: unknown field"}},
		{name: "keys are case-sensitive", raw: "Name: a\n", want: []string{"Name: unknown field"}},
		{name: "dash-tagged field is unknown", raw: "name: a\nSkip: x\n", want: []string{"Skip: unknown field"}},
		{name: "every problem is reported", raw: "name: 3\nbogus: 1\nitems: {}\n", want: []string{"name: must be a string, got 3", "bogus: unknown field", "items: must be a list, got {}"}},
		{name: "fraction for an integer", raw: "items:\n- {count: 2.5}\n", want: []string{"items[0].count: must be an integer, got 2.5"}},
		{name: "string for an integer", raw: "items:\n- {count: \"2\"}\n", want: []string{`items[0].count: must be an integer, got "2"`}},
		{name: "integer overflow", raw: "items:\n- {tiny: 300}\n", want: []string{"items[0].tiny: must be an integer, got 300"}},
		{name: "bool", raw: "items:\n- {flag: yes please}\n", want: []string{"items[0].flag: must be true or false"}},
		{name: "float", raw: "items:\n- {ratio: half}\n", want: []string{"items[0].ratio: must be a number"}},
		{name: "bad quantity", raw: "items:\n- {size: lots}\n", want: []string{`items[0].size: invalid value "lots"`}},
		{name: "not an object", raw: "- a\n- b\n", want: []string{"(document): must be an object"}},
		{name: "empty", raw: "", want: []string{"document is empty"}},
		{name: "duplicate key", raw: "name: a\nname: b\n", want: []string{`"name" already set`}},
		{name: "two documents", raw: "name: a\n---\nname: b\n", want: []string{"2 or more YAML documents"}},
		{name: "comments around one document", raw: "# x\n---\nname: a\n---\n# y\n"},
		{name: "malformed", raw: "name: [\n", want: []string{"yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc strictDoc
			err := decodeStrict([]byte(tt.raw), &doc)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("decodeStrict: %v", err)
				}
				if doc.Name != "a" {
					t.Errorf("name = %q, want a", doc.Name)
				}
				return
			}
			if err == nil {
				t.Fatalf("decodeStrict succeeded with %+v, want an error", doc)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDecodeStrictValues(t *testing.T) {
	var doc strictDoc
	raw := "name: a\nshared: s\nitems:\n- {count: 2, size: 1Gi, flag: true, ratio: 0.5, tiny: -3}\n"
	if err := decodeStrict([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	it := doc.Items[0]
	if doc.Shared != "s" || *it.Count != 2 || it.Size.Value() != 1<<30 || !it.Flag || it.Ratio != 0.5 || it.Tiny != -3 {
		t.Errorf("decoded %+v with item %+v", doc, it)
	}
}

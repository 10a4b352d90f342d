package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestDisplayName(t *testing.T) {
	tests := []struct {
		argv0 string
		want  string
	}{
		{"gpulink", "gpulink"},
		{"/usr/local/bin/gpulink", "gpulink"},
		{"/usr/local/bin/kubectl-gpulink", "kubectl gpulink"},
		{"kubectl-gpulink.exe", "kubectl gpulink"},
		{"kubectl-gpu_link", "kubectl gpu-link"},
		{"kubectl-", "kubectl-"},
		{"", "gpulink"},
	}
	for _, tt := range tests {
		t.Run(tt.argv0, func(t *testing.T) {
			if got := DisplayName(tt.argv0); got != tt.want {
				t.Errorf("DisplayName(%q) = %q, want %q", tt.argv0, got, tt.want)
			}
		})
	}
}

func TestExecuteUsage(t *testing.T) {
	tests := []struct {
		name       string
		argv0      string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{
			name:       "help lists the commands",
			argv0:      "gpulink",
			args:       []string{"--help"},
			wantStdout: []string{"gpulink [command]", "topology", "simulate"},
		},
		{
			name:       "kubectl plugin help uses the kubectl name",
			argv0:      "/opt/bin/kubectl-gpulink",
			args:       []string{"topology", "--help"},
			wantStdout: []string{"kubectl gpulink topology FILE", "  kubectl gpulink topology node.txt --output json"},
		},
		{
			name:       "unknown command",
			argv0:      "gpulink",
			args:       []string{"topologee"},
			wantCode:   1,
			wantStderr: []string{`unknown command "topologee"`, "Run 'gpulink --help' for usage."},
		},
		{
			name:       "missing argument",
			argv0:      "gpulink",
			args:       []string{"topology"},
			wantCode:   1,
			wantStderr: []string{"accepts 1 arg(s), received 0", "Run 'gpulink topology --help' for usage."},
		},
		{
			name:       "bad output format names the flag and value",
			argv0:      "kubectl-gpulink",
			args:       []string{"topology", v100File, "--output", "yaml"},
			wantCode:   1,
			wantStderr: []string{`"yaml" for "-o, --output" flag`, "want table or json", "Run 'kubectl gpulink topology --help' for usage."},
		},
		{
			name:       "simulate needs a scenario",
			argv0:      "gpulink",
			args:       []string{"simulate"},
			wantCode:   1,
			wantStderr: []string{"--scenario is required", "Run 'gpulink simulate --help' for usage."},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Execute(append([]string{tt.argv0}, tt.args...), &out, &errOut)
			if code != tt.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tt.wantCode, errOut.String())
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout does not contain %q:\n%s", w, out.String())
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr does not contain %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

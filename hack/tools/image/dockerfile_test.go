package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const dockerfilePath = "../../../deployments/container/Dockerfile"

// dockerfile is what the image-relevant instructions of the Dockerfile say.
type dockerfile struct {
	builds     map[string]binary // by output name
	copyDest   string            // where COPY --from=build /out/ puts them
	user       string
	entrypoint string
	labels     []string // keys
}

var (
	buildRe = regexp.MustCompile(`CGO_ENABLED=([01]) go build [^;]*-o /out/(\S+) (\S+?);?\s*\\?$`)
	copyRe  = regexp.MustCompile(`^COPY --from=build /out/ (\S+)$`)
	labelRe = regexp.MustCompile(`(org\.opencontainers\.image\.[a-z]+)=`)
)

func parseDockerfile(t *testing.T, text string) dockerfile {
	t.Helper()
	d := dockerfile{builds: map[string]binary{}}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if m := buildRe.FindStringSubmatch(line); m != nil {
			d.builds[m[2]] = binary{name: m[2], pkg: m[3], cgo: m[1] == "1"}
		}
		if m := copyRe.FindStringSubmatch(line); m != nil {
			d.copyDest = m[1]
		}
		if v, ok := strings.CutPrefix(line, "USER "); ok {
			d.user = v
		}
		if v, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			d.entrypoint = v
		}
		for _, m := range labelRe.FindAllStringSubmatch(line, -1) {
			d.labels = append(d.labels, m[1])
		}
	}
	sort.Strings(d.labels)
	return d
}

// diffContents lists every way the Dockerfile differs from contents.go.
func diffContents(d dockerfile) []string {
	var diffs []string
	for _, b := range binaries {
		got, ok := d.builds[b.name]
		switch {
		case !ok:
			diffs = append(diffs, "the Dockerfile builds no /out/"+b.name+" (make image ships /"+binDir+"/"+b.name+")")
		case got.pkg != b.pkg:
			diffs = append(diffs, b.name+": Dockerfile builds "+got.pkg+", make image "+b.pkg)
		case got.cgo != b.cgo:
			diffs = append(diffs, b.name+": cgo differs between the Dockerfile and make image")
		}
	}
	for n := range d.builds {
		found := false
		for _, b := range binaries {
			found = found || b.name == n
		}
		if !found {
			diffs = append(diffs, "the Dockerfile builds /out/"+n+", which make image does not ship (add it to contents.go)")
		}
	}
	if want := "/" + binDir + "/"; d.copyDest != want {
		diffs = append(diffs, "Dockerfile copies the binaries to "+d.copyDest+", make image to "+want)
	}
	if want := "65532:65532"; d.user != want {
		diffs = append(diffs, "Dockerfile USER "+d.user+", make image "+want)
	}
	if want := `["` + entrypoint + `"]`; d.entrypoint != want {
		diffs = append(diffs, "Dockerfile ENTRYPOINT "+d.entrypoint+", make image "+want)
	}
	var keys []string
	for k := range labels("x") {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != strings.Join(d.labels, ",") {
		diffs = append(diffs, "labels: Dockerfile "+strings.Join(d.labels, ",")+", make image "+strings.Join(keys, ","))
	}
	return diffs
}

// TestDockerfileMatchesContents keeps deployments/container/Dockerfile and
// make image from drifting apart: same binaries (package, cgo), path, user,
// entrypoint and label keys.
func TestDockerfileMatchesContents(t *testing.T) {
	data, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffContents(parseDockerfile(t, string(data))) {
		t.Error(d)
	}
}

// TestDockerfileDriftIsCaught proves the check above can fail: a Dockerfile
// without the nvidia-cdi-hook build, with another user and an extra binary
// is reported on each count.
func TestDockerfileDriftIsCaught(t *testing.T) {
	data, err := os.ReadFile(filepath.FromSlash(dockerfilePath))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	text = regexp.MustCompile(`(?m)^.*-o /out/nvidia-cdi-hook .*$`).ReplaceAllString(text, "")
	text = strings.Replace(text, "USER 65532:65532", "USER 0:0", 1)
	line := "-o /out/gpulink ./cmd/gpulink; \\\n"
	if !strings.Contains(text, line) {
		t.Fatalf("the Dockerfile has no line ending in %q to add a build after", line)
	}
	text = strings.Replace(text, line, line+"    CGO_ENABLED=0 go build -o /out/extra ./cmd/extra; \\\n", 1)
	diffs := strings.Join(diffContents(parseDockerfile(t, text)), "\n")
	for _, want := range []string{"no /out/nvidia-cdi-hook", "USER 0:0", "/out/extra"} {
		if !strings.Contains(diffs, want) {
			t.Errorf("drift %q not reported; got:\n%s", want, diffs)
		}
	}
}

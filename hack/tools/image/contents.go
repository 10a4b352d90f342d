package main

// What the gpulink image holds. deployments/container/Dockerfile builds the
// same image with Docker; dockerfile_test.go parses it and fails when the two
// disagree on a binary, its cgo setting, its path, the user, the entrypoint
// or a label, so they cannot drift apart silently.

// binary is one program of the image, installed as binDir/<name>.
type binary struct {
	name string // file name under binDir
	pkg  string // Go package built from the gpulink module
	// cgo: go-nvml dlopens libnvidia-ml.so.1, which needs the C runtime
	// (the kubelet plugin); nvidia-cdi-hook is built the way its own
	// project builds it. Everything else is static and does not depend on
	// the image's glibc.
	cgo bool
}

const (
	binDir = "usr/bin"
	// nonroot is the default user and group, as in distroless images.
	nonrootID   = 65532
	nonrootName = "nonroot"
	entrypoint  = "/usr/bin/gpulink"
	// caBundle is where Go's crypto/x509 looks first on Debian systems.
	caBundle = "etc/ssl/certs/ca-certificates.crt"
)

var binaries = []binary{
	{name: "gpulink", pkg: "./cmd/gpulink"},
	{name: "gpulink-controller", pkg: "./cmd/gpulink-controller"},
	{name: "gpulink-kubeletplugin", pkg: "./cmd/gpulink-kubeletplugin", cgo: true},
	// The CDI hooks (update-ldcache, create-symlinks) that the kubelet
	// plugin's specs reference; a `tool` in the gpulink go.mod, so its
	// version is pinned there.
	{name: "nvidia-cdi-hook", pkg: "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook", cgo: true},
}

// labels returns the OCI annotations of the image config, the Dockerfile's
// LABEL instruction.
func labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "gpulink",
		"org.opencontainers.image.description": "Topology-aware DRA driver for NVIDIA GPUs",
		"org.opencontainers.image.source":      "https://github.com/gpulink/gpulink",
		"org.opencontainers.image.version":     version,
	}
}

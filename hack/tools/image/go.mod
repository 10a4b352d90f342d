// The image builder behind `make image` (hack/image.sh): packs the gpulink
// binaries and a Debian glibc/CA root file system into an OCI image archive
// without a Docker engine or a registry. A module of its own so that
// go-containerregistry and its dependencies never enter the driver's go.mod.
// Update with: go get github.com/google/go-containerregistry@vX.Y.Z && go mod tidy
module github.com/gpulink/gpulink/hack/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)

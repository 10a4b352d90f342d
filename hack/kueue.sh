#!/usr/bin/env bash
# Builds the Kueue manager the e2e tests of gpulink under Kueue run
# (test/e2e/kueue_*_test.go; make kueue, a prerequisite of
# make test-integration).
#
#   hack/kueue.sh          build $GPULINK_BIN_DIR/kueue (default _output/bin) if missing or outdated
#   hack/kueue.sh --crds   print the directory of Kueue's CRDs (config/components/crd/bases
#                          of the pinned module in the module cache), downloading the module if needed
#
# Kueue is built from its Go module (hack/tools/kueue, a module of its own
# pinned by go.sum: Kueue brings its own k8s.io minor and controller-runtime)
# because only the Go module proxy is reachable from CI; no release image or
# manifest is downloaded. The build is Kueue's own cmd/kueue with its release
# build's version stamps. Its CRDs are not copied into the project: the
# tests read them from the same module in the module cache (--crds). The
# binary is rebuilt when its stamp (_output/bin/.stamps/kueue, as for the
# cluster binaries) no longer matches the tools module, the Go toolchain or
# this build.
set -o errexit -o nounset -o pipefail

LOG_TAG=kueue.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KUEUE="${BIN_DIR}/kueue"
STAMP="${BIN_DIR}/.stamps/kueue"
TOOLS="${REPO_ROOT}/hack/tools/kueue"
MODULE=sigs.k8s.io/kueue

# module_dir prints the pinned Kueue module's directory in the module cache.
module_dir() {
	(cd "${TOOLS}" && GOFLAGS=-mod=readonly go mod download -json "${MODULE}") |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

build_kueue() {
	local version="$1"
	(
		cd "${TOOLS}"
		CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "${KUEUE}.tmp" \
			-ldflags "-s -w -X ${MODULE}/pkg/version.GitVersion=${version} \
				-X ${MODULE}/pkg/version.GitCommit=module-${version}" \
			"${MODULE}/cmd/kueue"
	)
	mv "${KUEUE}.tmp" "${KUEUE}"
}

case "${1:-}" in
--crds)
	dir=$(module_dir)
	[[ -d "${dir}/config/components/crd/bases" ]] || die "no CRDs in ${dir}/config/components/crd/bases"
	echo "${dir}/config/components/crd/bases"
	exit 0
	;;
"") ;;
*)
	usage
	exit 2
	;;
esac

version=$(cd "${TOOLS}" && go list -m -f '{{.Version}}' "${MODULE}")
key=$({
	cat "${TOOLS}/go.mod" "${TOOLS}/go.sum"
	go env GOVERSION GOOS GOARCH
	declare -f build_kueue
} | sha256sum | cut -d' ' -f1)
if [[ -x "${KUEUE}" && -f "${STAMP}" && "$(<"${STAMP}")" == "${key}" ]]; then
	exit 0
fi
mkdir -p "${BIN_DIR}/.stamps"
log "building Kueue ${version} (${MODULE}/cmd/kueue) into ${KUEUE}"
start=${SECONDS}
build_kueue "${version}"
echo "${key}" >"${STAMP}"
log "built Kueue ${version} in $((SECONDS - start))s"

#!/usr/bin/env bash
# Builds the Prometheus server the e2e test test/e2e/prometheus_test.go
# scrapes gpulink with (make test-prometheus).
#
#   hack/prometheus.sh   build $GPULINK_BIN_DIR/prometheus (default _output/bin) if missing or outdated
#
# Prometheus is built from source (hack/tools/prometheus, a Go module of its
# own pinned by go.sum) because only the Go module proxy is reachable from
# CI; no release tarball is downloaded. The build is Prometheus's own
# cmd/prometheus with its release build's version stamps, with two
# differences the test does not need: the tag remove_all_sd leaves out
# every service discovery but static, file and HTTP (the test writes the
# scrape targets the ServiceMonitor selects into static_configs), and
# without the tag builtinassets the web UI's assets are not embedded (the
# test only uses the HTTP API). The binary is rebuilt when its stamped
# version no longer matches hack/tools/prometheus/go.mod.
set -o errexit -o nounset -o pipefail

LOG_TAG=prometheus.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PROMETHEUS="${BIN_DIR}/prometheus"
TOOLS="${REPO_ROOT}/hack/tools/prometheus"
MODULE=github.com/prometheus/prometheus

[[ $# -eq 0 ]] || { usage; exit 2; }

# The module is v0.3XX.Y; its VERSION file holds the release it is (3.XX.Y),
# which the release build stamps and `prometheus --version` prints. The
# module version goes into the revision, so the stamp names both.
mod=$(cd "${TOOLS}" && go list -m -f '{{.Version}}' "${MODULE}")
dir=$(cd "${TOOLS}" && GOFLAGS=-mod=readonly go mod download -json "${MODULE}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
release=$(<"${dir}/VERSION")
want="prometheus, version ${release} (branch: HEAD, revision: ${mod})"
have=""
if [[ -x "${PROMETHEUS}" ]]; then
	have=$("${PROMETHEUS}" --version 2>/dev/null | head -n1 || true)
fi
if [[ "${have}" == "${want}" ]]; then
	exit 0
fi
log "building Prometheus ${release} (${MODULE} ${mod}) into ${PROMETHEUS}"
start=${SECONDS}
(
	cd "${TOOLS}"
	CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -tags remove_all_sd -o "${PROMETHEUS}.tmp" \
		-ldflags "-s -w -X github.com/prometheus/common/version.Version=${release} \
			-X github.com/prometheus/common/version.Revision=${mod} \
			-X github.com/prometheus/common/version.Branch=HEAD" \
		"${MODULE}/cmd/prometheus"
)
mv "${PROMETHEUS}.tmp" "${PROMETHEUS}"
log "built $("${PROMETHEUS}" --version 2>/dev/null | head -n1) in $((SECONDS - start))s"

#!/usr/bin/env bash
# Runs golangci-lint over the gpulink code (make lint; part of make test).
#
#   hack/lint.sh            build $GPULINK_BIN_DIR/golangci-lint (default _output/bin) if needed, lint
#   hack/lint.sh --build    only build it
#   hack/lint.sh ARGS...    extra arguments for `golangci-lint run`
#                           (e.g. --fix, or package patterns instead of ./...)
#
# golangci-lint is built from source (hack/tools/lint, a Go module of its own
# pinned by go.sum) because only the Go module proxy is reachable from CI; no
# prebuilt binaries are downloaded. The binary is rebuilt when its stamped
# version no longer matches hack/tools/lint/go.mod. The configuration is
# .golangci.yml at the repository root. The build tags integration, e2e and
# prometheus are set so that the tests under test/ are linted as well.
set -o errexit -o nounset -o pipefail

LOG_TAG=lint.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LINT="${BIN_DIR}/golangci-lint"
TOOLS="${REPO_ROOT}/hack/tools/lint"

build_lint() {
	local want have=""
	want=$(cd "${TOOLS}" && go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
	want=${want#v}
	if [[ -x "${LINT}" ]]; then
		have=$("${LINT}" version --short 2>/dev/null || true)
	fi
	if [[ "${have}" == "${want}" ]]; then
		return 0
	fi
	log "building golangci-lint ${want} into ${LINT}"
	# main.version/commit/date are what golangci-lint's release build
	# stamps; without them `golangci-lint version` reports "(devel)".
	build_go_tool "${TOOLS}" "${LINT}" "-X main.version=${want} -X main.commit=v${want} -X main.date=unknown" \
		github.com/golangci/golangci-lint/v2/cmd/golangci-lint
}

build_lint
if [[ "${1:-}" == "--build" ]]; then
	exit 0
fi

cd "${REPO_ROOT}"
if [[ $# -eq 0 ]]; then
	set -- ./...
fi
log "golangci-lint $("${LINT}" version --short) run --build-tags integration,e2e,prometheus $*"
exec "${LINT}" run --build-tags integration,e2e,prometheus "$@"

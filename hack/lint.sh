#!/usr/bin/env bash
# Runs golangci-lint over the gpulink code (make lint; part of make test).
#
#   hack/lint.sh            build _output/bin/golangci-lint if needed, lint
#   hack/lint.sh --build    only build _output/bin/golangci-lint
#   hack/lint.sh ARGS...    extra arguments for `golangci-lint run`
#                           (e.g. --fix, or package patterns instead of ./...)
#
# golangci-lint is built from source (hack/tools/lint, a Go module of its own
# pinned by go.sum) because only the Go module proxy is reachable from CI; no
# prebuilt binaries are downloaded. The binary is rebuilt when its stamped
# version no longer matches hack/tools/lint/go.mod. The configuration is
# .golangci.yml at the repository root. The build tags integration and e2e
# are set so that the tests under test/ are linted as well.
set -o errexit -o nounset -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="${ROOT}/_output/bin"
LINT="${BIN}/golangci-lint"
TOOLS="${ROOT}/hack/tools/lint"

log() { printf '>>> %s\n' "$*" >&2; }

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
	mkdir -p "${BIN}"
	(
		cd "${TOOLS}"
		# -mod=readonly: go.sum in the repository is the source of truth;
		# a missing or changed checksum is an error, never silently fixed.
		# main.version/date are what golangci-lint's release build stamps;
		# without them `golangci-lint version` reports "(devel)".
		CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "${LINT}.tmp" -ldflags "-s -w \
			-X main.version=${want} \
			-X main.commit=v${want} \
			-X main.date=unknown" \
			github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	)
	mv "${LINT}.tmp" "${LINT}"
}

build_lint
if [[ "${1:-}" == "--build" ]]; then
	exit 0
fi

cd "${ROOT}"
if [[ $# -eq 0 ]]; then
	set -- ./...
fi
log "golangci-lint $("${LINT}" version --short) run --build-tags integration,e2e $*"
exec "${LINT}" run --build-tags integration,e2e "$@"

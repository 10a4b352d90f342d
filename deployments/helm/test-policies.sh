#!/usr/bin/env bash
# Checks the chart's admission policies and RBAC against a real
# kube-apiserver: installs the rendered chart into a throw-away etcd +
# kube-apiserver (no controllers, no nodes) and then
#   - creates pods and checks what the MutatingAdmissionPolicy did to their
#     scheduling gates;
#   - writes ResourceSlices with a token of the kubelet plugin's service
#     account bound to a pod on node-a, and checks that the
#     ValidatingAdmissionPolicy and the ClusterRole let through exactly the
#     slices of driver gpu.gpulink.dev on node-a.
#
#   deployments/helm/test-policies.sh [RENDERED.yaml...]
#
# Each RENDERED file (helm template output for namespace gpulink-system, or
# a demo manifest for namespace gpulink-demo) is also applied with
# --dry-run=server, which runs the API server's full validation (schemas,
# CEL compilation, RBAC rule checks) on it.
#
# Needs $GPULINK_BIN_DIR (default _output/bin)/{helm,etcd,kube-apiserver,kubectl} (hack/helm.sh --build,
# hack/cluster.sh build) and openssl. hack/helm.sh runs it when they exist.
# Ports: 127.0.0.1:$ETCD_PORT, $ETCD_PORT+1 (peer) and $APISERVER_PORT;
# the defaults derive from the process ID so that parallel runs (CI jobs on
# one machine) do not collide.
set -o errexit -o nounset -o pipefail

LOG_TAG=test-policies.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../hack/lib.sh"
CHART="${REPO_ROOT}/deployments/helm/gpulink"
ETCD_PORT=${ETCD_PORT:-$((20000 + ($$ % 10000) * 2))}
APISERVER_PORT=${APISERVER_PORT:-$((ETCD_PORT + 20001))}
NS=gpulink-system
PLUGIN_SA=gpulink-kubelet-plugin
GATE=gpu.gpulink.dev/allocation

fail() { log "FAIL: $*"; FAILED=1; }
FAILED=0

for b in helm etcd kube-apiserver kubectl; do
	[[ -x "${BIN_DIR}/${b}" ]] || die "${BIN_DIR}/${b} not built"
done
command -v openssl >/dev/null || die "openssl not found"

WORK=$(mktemp -d)
PIDS=()
cleanup_processes() {
	# Newest first: kube-apiserver before its etcd, which it would otherwise
	# wait for during its graceful shutdown. SIGKILL after 10 s: nothing
	# here has state worth a clean shutdown.
	local i pid
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		pid=${PIDS[i]}
		if kill "${pid}" 2>/dev/null; then
			for _ in $(seq 20); do
				kill -0 "${pid}" 2>/dev/null || break
				sleep 0.5
			done
			kill -9 "${pid}" 2>/dev/null || true
		fi
		wait "${pid}" 2>/dev/null || true
	done
	PIDS=()
}
cleanup() {
	cleanup_processes
	rm -rf "${WORK}"
}
trap cleanup EXIT

# --- a bare control plane -----------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
	-addext subjectAltName=IP:127.0.0.1 \
	-keyout "${WORK}/serving.key" -out "${WORK}/serving.crt" 2>/dev/null
openssl genrsa -out "${WORK}/sa.key" 2048 2>/dev/null
openssl rsa -in "${WORK}/sa.key" -pubout -out "${WORK}/sa.pub" 2>/dev/null
ADMIN_TOKEN=$(openssl rand -hex 16)
echo "${ADMIN_TOKEN},admin,admin,system:masters" >"${WORK}/tokens.csv"

# start_control_plane starts etcd and kube-apiserver on ETCD_PORT and
# APISERVER_PORT and waits until the API server is ready. It fails (after
# stopping both) when either exits early, typically because a port is taken.
start_control_plane() {
	rm -rf "${WORK}/etcd"
	"${BIN_DIR}/etcd" --data-dir "${WORK}/etcd" --unsafe-no-fsync \
		--listen-client-urls "http://127.0.0.1:${ETCD_PORT}" \
		--advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
		--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-cluster "default=http://127.0.0.1:$((ETCD_PORT + 1))" \
		>"${WORK}/etcd.log" 2>&1 &
	PIDS+=($!)
	"${BIN_DIR}/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
		--bind-address 127.0.0.1 --secure-port "${APISERVER_PORT}" \
		--tls-cert-file "${WORK}/serving.crt" --tls-private-key-file "${WORK}/serving.key" \
		--token-auth-file "${WORK}/tokens.csv" --authorization-mode Node,RBAC \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "${WORK}/sa.pub" \
		--service-account-signing-key-file "${WORK}/sa.key" \
		--service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
		--allow-privileged=true \
		>"${WORK}/apiserver.log" 2>&1 &
	PIDS+=($!)
	cat >"${WORK}/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority: ${WORK}/serving.crt
users:
- name: admin
  user:
    token: ${ADMIN_TOKEN}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
EOF
	local pid
	for _ in $(seq 120); do
		for pid in "${PIDS[@]}"; do
			if ! kill -0 "${pid}" 2>/dev/null; then
				tail -n 3 "${WORK}/etcd.log" "${WORK}/apiserver.log" >&2
				cleanup_processes
				return 1
			fi
		done
		kc get --raw /readyz >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	tail -n 20 "${WORK}/apiserver.log" >&2
	die "kube-apiserver not ready after 60 s"
}

export KUBECONFIG="${WORK}/kubeconfig"
# A request timeout keeps a wedged API server from hanging the test.
kc() { "${BIN_DIR}/kubectl" --request-timeout=30s "$@"; }

log "starting etcd and kube-apiserver"
attempt=1
until start_control_plane; do
	((attempt < 3)) || die "etcd or kube-apiserver keep exiting; see the logs above"
	log "etcd or kube-apiserver exited (port taken?); retrying on other ports"
	ETCD_PORT=$((ETCD_PORT + 7))
	APISERVER_PORT=$((APISERVER_PORT + 7))
	((attempt++))
done

# --- install the chart's objects ----------------------------------------
log "applying the rendered chart"
kc create namespace "${NS}" >/dev/null
"${BIN_DIR}/helm" template gpulink "${CHART}" --namespace "${NS}" --kube-version v1.37.0 >"${WORK}/chart.yaml"
kc apply -f "${WORK}/chart.yaml" >/dev/null
# No static type check of the policies' CEL here: kube-controller-manager
# writes that (status.typeChecking) and does not run. Every expression is
# evaluated below instead, and with failurePolicy Fail a type error at
# run time would turn an expected "allowed" into a failure.

kc create namespace gpulink-demo >/dev/null
kc -n gpulink-demo create serviceaccount default >/dev/null
for rendered in "$@"; do
	if out=$(kc apply --dry-run=server -f "${rendered}" 2>&1); then
		log "ok: server-side dry run of ${rendered#"${REPO_ROOT}"/}"
	else
		fail "server-side dry run of ${rendered}: ${out}"
	fi
done

# --- MutatingAdmissionPolicy: the scheduling gate --------------------------
kc create namespace gate-test >/dev/null
kc -n gate-test create serviceaccount default >/dev/null

# pod NAME [claims] [gates JSON] [nodeName]: a pod manifest.
pod() {
	local name=$1 claims=${2:-} gates=${3:-} node=${4:-}
	printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"gate-test"},"spec":{' "${name}"
	[[ -n "${claims}" ]] && printf '"resourceClaims":[{"name":"gpu","resourceClaimTemplateName":"one-gpu"}],'
	[[ -n "${gates}" ]] && printf '"schedulingGates":%s,' "${gates}"
	[[ -n "${node}" ]] && printf '"nodeName":"%s",' "${node}"
	printf '"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"'
	[[ -n "${claims}" ]] && printf ',"resources":{"claims":[{"name":"gpu"}]}'
	printf '}]}}\n'
}
gates_of() { kc -n gate-test get pod "$1" -o jsonpath='{range .spec.schedulingGates[*]}{.name}{" "}{end}'; }

log "waiting for the MutatingAdmissionPolicy to take effect"
for _ in $(seq 60); do
	probe=$(pod probe claims | kc create --dry-run=server -o jsonpath='{.spec.schedulingGates[*].name}' -f - 2>/dev/null || true)
	[[ "${probe}" == "${GATE}" ]] && break
	sleep 0.5
done
[[ "${probe:-}" == "${GATE}" ]] || fail "gate policy never took effect"

expect_gates() {
	local name=$1 want=$2 got
	got=$(gates_of "${name}")
	if [[ "${got}" == "${want}" ]]; then
		log "ok: pod ${name}: gates [${got% }]"
	else
		fail "pod ${name}: gates [${got% }], want [${want% }]"
	fi
}
pod with-claims claims | kc create -f - >/dev/null
expect_gates with-claims "${GATE} "
pod other-gate claims '[{"name":"example.com/other"}]' | kc create -f - >/dev/null
expect_gates other-gate "example.com/other ${GATE} "
pod already-gated claims "[{\"name\":\"${GATE}\"}]" | kc create -f - >/dev/null
expect_gates already-gated "${GATE} "
pod no-claims | kc create -f - >/dev/null
expect_gates no-claims ""
pod bound claims "" some-node | kc create -f - >/dev/null
expect_gates bound ""

# --- MutatingAdmissionPolicy: the claim finalizer --------------------------
CLAIM_FINALIZER=gpu.gpulink.dev/allocation
# claim NAME REQUESTS [FINALIZERS]: a ResourceClaim manifest in gate-test.
claim() {
	printf '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"%s","namespace":"gate-test"%s},"spec":{"devices":{"requests":%s}}}' \
		"$1" "${3:+,\"finalizers\":$3}" "$2"
}
finalizers_of() { kc -n gate-test get resourceclaim "$1" -o jsonpath='{range .metadata.finalizers[*]}{@}{" "}{end}'; }
expect_finalizers() {
	local name=$1 want=$2 got
	got=$(finalizers_of "${name}")
	if [[ "${got}" == "${want}" ]]; then
		log "ok: claim ${name}: finalizers [${got% }]"
	else
		fail "claim ${name}: finalizers [${got% }], want [${want% }]"
	fi
}
log "waiting for the claim finalizer policy to take effect"
for _ in $(seq 60); do
	probe=$(claim probe '[{"name":"g","exactly":{"deviceClassName":"gpu.gpulink.dev"}}]' |
		kc create --dry-run=server -o jsonpath='{.metadata.finalizers[*]}' -f - 2>/dev/null || true)
	[[ "${probe}" == "${CLAIM_FINALIZER}" ]] && break
	sleep 0.5
done
[[ "${probe:-}" == "${CLAIM_FINALIZER}" ]] || fail "claim finalizer policy never took effect"
claim whole '[{"name":"g","exactly":{"deviceClassName":"gpu.gpulink.dev","count":2}}]' | kc create -f - >/dev/null
expect_finalizers whole "${CLAIM_FINALIZER} "
claim share '[{"name":"s","exactly":{"deviceClassName":"gpu-share.gpulink.dev"}}]' | kc create -f - >/dev/null
expect_finalizers share "${CLAIM_FINALIZER} "
claim fallback '[{"name":"g","firstAvailable":[{"name":"other","deviceClassName":"example.com-fpga"},{"name":"gl","deviceClassName":"gpu.gpulink.dev"}]}]' | kc create -f - >/dev/null
expect_finalizers fallback "${CLAIM_FINALIZER} "
claim second-request '[{"name":"a","exactly":{"deviceClassName":"example.com-fpga"}},{"name":"b","exactly":{"deviceClassName":"gpu-share.gpulink.dev"}}]' | kc create -f - >/dev/null
expect_finalizers second-request "${CLAIM_FINALIZER} "
claim kept '[{"name":"g","exactly":{"deviceClassName":"gpu.gpulink.dev"}}]' '["example.com/hold"]' | kc create -f - >/dev/null
expect_finalizers kept "example.com/hold ${CLAIM_FINALIZER} "
claim once '[{"name":"g","exactly":{"deviceClassName":"gpu.gpulink.dev"}}]' "[\"${CLAIM_FINALIZER}\"]" | kc create -f - >/dev/null
expect_finalizers once "${CLAIM_FINALIZER} "
claim foreign '[{"name":"f","exactly":{"deviceClassName":"example.com-fpga"}}]' | kc create -f - >/dev/null
expect_finalizers foreign ""
kc -n gate-test delete resourceclaim whole share fallback second-request kept once foreign --wait=false >/dev/null

# --- ValidatingAdmissionPolicy + RBAC: the kubelet plugin's slices --------
log "minting a token of ${PLUGIN_SA} bound to a pod on node-a"
for node in node-a node-b; do
	kc create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"${node}"}}
EOF
done
kc -n "${NS}" create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"plugin-on-node-a","namespace":"${NS}"},
 "spec":{"serviceAccountName":"${PLUGIN_SA}","nodeName":"node-a",
         "containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}
EOF
PLUGIN_TOKEN=$(kc -n "${NS}" create token "${PLUGIN_SA}" --bound-object-kind Pod --bound-object-name plugin-on-node-a)
UNBOUND_TOKEN=$(kc -n "${NS}" create token "${PLUGIN_SA}")
as_plugin() { kc --token "${PLUGIN_TOKEN}" "$@"; }

# slice NAME NODE [DRIVER [GENERATION [POOL]]]: a ResourceSlice manifest;
# the pool is named after the node unless POOL says otherwise.
slice() {
	local name=$1 node=$2 driver=${3:-gpu.gpulink.dev} generation=${4:-1} pool=${5:-$2}
	printf '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"%s"},"spec":{"driver":"%s","nodeName":"%s","pool":{"name":"%s","generation":%s,"resourceSliceCount":1},"devices":[{"name":"gpu-0"}]}}\n' \
		"${name}" "${driver}" "${node}" "${pool}" "${generation}"
}

log "waiting for the ValidatingAdmissionPolicy to take effect"
for _ in $(seq 60); do
	if ! slice probe node-b | as_plugin create --dry-run=server -f - >/dev/null 2>&1; then
		break
	fi
	sleep 0.5
done

# expect allow|deny DESCRIPTION COMMAND...
expect() {
	local want=$1 what=$2 out
	shift 2
	if out=$("$@" 2>&1); then
		if [[ "${want}" == allow ]]; then
			log "ok: allowed: ${what}"
		else
			fail "allowed, want denied: ${what}"
		fi
	else
		if [[ "${want}" == deny ]]; then
			log "ok: denied: ${what} (${out##*: })"
		else
			fail "denied, want allowed: ${what}: ${out}"
		fi
	fi
}
# write VERB TOKEN SLICE-ARGS...: create or replace (an update, which is
# what the plugin's slice controller sends) a slice with TOKEN ("" = admin).
write() {
	local verb=$1 token=$2
	shift 2
	local auth=()
	[[ -n "${token}" ]] && auth=(--token "${token}")
	slice "$@" | kc "${auth[@]}" "${verb}" -f -
}
expect allow "plugin creates its node's slice" write create "${PLUGIN_TOKEN}" own node-a
expect deny "plugin creates a slice for another node" write create "${PLUGIN_TOKEN}" foreign node-b
expect deny "plugin creates another driver's slice" write create "${PLUGIN_TOKEN}" other node-a other.example.com
expect allow "plugin updates its node's slice" write replace "${PLUGIN_TOKEN}" own node-a gpu.gpulink.dev 2
# Pools are keyed by name and the newest generation wins: a slice of
# node-a in pool node-b would hide node-b's GPUs.
expect deny "plugin creates its node's slice in another node's pool" \
	write create "${PLUGIN_TOKEN}" shadow node-a gpu.gpulink.dev 99 node-b
expect deny "plugin creates its node's slice in a pool not named after a node" \
	write create "${PLUGIN_TOKEN}" odd-pool node-a gpu.gpulink.dev 1 shared
# (spec.pool.name is immutable, so the API server itself refuses moving a
# slice to another pool.) A slice of node-a in pool node-b that got in some
# other way, written by an administrator here, stays out of reach too.
write create "" admin-pool node-a gpu.gpulink.dev 1 node-b >/dev/null
expect deny "plugin updates a slice of its node that sits in another node's pool" \
	write replace "${PLUGIN_TOKEN}" admin-pool node-a gpu.gpulink.dev 99 node-b
expect deny "plugin deletes a slice of its node that sits in another node's pool" \
	as_plugin delete resourceslice admin-pool
expect allow "plugin lists slices" as_plugin get resourceslices
expect deny "plugin patches a slice (RBAC: the slice controller only updates)" \
	as_plugin label resourceslice own patched=true
write create "" theirs node-b >/dev/null
expect deny "plugin updates another node's slice" write replace "${PLUGIN_TOKEN}" theirs node-b gpu.gpulink.dev 2
expect deny "plugin deletes another node's slice" as_plugin delete resourceslice theirs
expect deny "token without a node (not bound to a pod) creates a slice" \
	write create "${UNBOUND_TOKEN}" unbound node-a
expect allow "plugin deletes its node's slice" as_plugin delete resourceslice own
expect allow "admin writes slices of any node (the policy binds only the plugin)" \
	write replace "" theirs node-b gpu.gpulink.dev 3
expect deny "plugin may not create pods other than its MPS daemon pods (admission policy; test/integration/kubeletplugin TestMPSDaemonPodPolicy checks every shape)" as_plugin -n "${NS}" run x --image=registry.k8s.io/pause:3.10
expect deny "plugin may not list claims (RBAC: get only)" as_plugin get resourceclaims -A

# --- the controller's RBAC: what allocating and ungating take ------------
log "checking the controller's permissions"
CONTROLLER_TOKEN=$(kc -n "${NS}" create token gpulink-controller)
as_controller() { kc --token "${CONTROLLER_TOKEN}" "$@"; }
CLAIM_SPEC='"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.gpulink.dev"}}]}}'
kc -n gate-test create -f - >/dev/null <<EOF
{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"one-gpu","namespace":"gate-test"},${CLAIM_SPEC}}
EOF
POD_UID=$(kc -n gate-test get pod with-claims -o jsonpath='{.metadata.uid}')
# allocate TOKEN: writes status.allocation and reservedFor the way the
# controller does, which takes resourceclaims/status and the synthetic
# resourceclaims/binding, with TOKEN's identity.
allocate() {
	kc --token "$1" -n gate-test replace --subresource=status -f - <<EOF
{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"one-gpu","namespace":"gate-test"},${CLAIM_SPEC},
 "status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpu.gpulink.dev","pool":"node-a","device":"gpu-0"}]},
   "nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}]},
   "allocationTimestamp":"2026-01-01T00:00:00Z"},
  "reservedFor":[{"resource":"pods","name":"with-claims","uid":"${POD_UID}"}]}}
EOF
}
# create_as TOKEN MANIFEST: creates an object with TOKEN's identity ("" = admin).
create_as() {
	local auth=()
	[[ -n "$1" ]] && auth=(--token "$1")
	kc "${auth[@]}" create -f - <<<"$2"
}
event='{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"test.1","namespace":"gate-test"},
 "eventTime":"2026-01-01T00:00:00.000000Z","reportingController":"gpu.gpulink.dev/controller","reportingInstance":"test",
 "action":"Allocate","reason":"Test","type":"Normal","note":"test",
 "regarding":{"kind":"Pod","namespace":"gate-test","name":"with-claims"}}'
lease() { printf '{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"%s","namespace":"%s"}}' "$1" "$2"; }

expect deny "plugin allocates a claim (RBAC)" allocate "${PLUGIN_TOKEN}"
expect allow "controller allocates a claim (status + binding)" allocate "${CONTROLLER_TOKEN}"
expect allow "controller adds its finalizer to a claim" \
	as_controller -n gate-test patch resourceclaim one-gpu --type=merge -p '{"metadata":{"finalizers":["gpu.gpulink.dev/allocation"]}}'
expect allow "controller lifts a pod's scheduling gate" \
	as_controller -n gate-test patch pod with-claims --type=json -p '[{"op":"remove","path":"/spec/schedulingGates/0"}]'
expect allow "controller reads slices, classes and nodes" as_controller get resourceslices,deviceclasses,nodes
expect allow "controller records an event" create_as "${CONTROLLER_TOKEN}" "${event}"
expect allow "controller creates its Lease" create_as "${CONTROLLER_TOKEN}" "$(lease gpulink-controller "${NS}")"
expect allow "controller reads its Lease" as_controller -n "${NS}" get lease gpulink-controller
create_as "" "$(lease other "${NS}")" >/dev/null
expect deny "controller reads another Lease" as_controller -n "${NS}" get lease other
expect deny "controller creates a Lease in another namespace" \
	create_as "${CONTROLLER_TOKEN}" "$(lease gpulink-controller gate-test)"
expect deny "controller may not delete pods" as_controller -n gate-test delete pod no-claims
# The translation webhook's templates: created in the pod's namespace,
# refreshed, listed and deleted by the collector.
compat_template='{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimTemplate","metadata":{"name":"gpulink-compat-test","namespace":"gate-test","labels":{"gpu.gpulink.dev/compat":"true"}},"spec":{'"${CLAIM_SPEC}"'}}'
expect allow "controller creates a translated ResourceClaimTemplate" create_as "${CONTROLLER_TOKEN}" "${compat_template}"
expect allow "controller refreshes a translated template (update)" \
	as_controller -n gate-test auth can-i update resourceclaimtemplates/gpulink-compat-test
expect allow "controller lists translated templates everywhere" as_controller get resourceclaimtemplates -A -l gpu.gpulink.dev/compat=true
expect allow "controller deletes an unused translated template" as_controller -n gate-test delete resourceclaimtemplate gpulink-compat-test
expect deny "plugin creates a ResourceClaimTemplate" create_as "${PLUGIN_TOKEN}" "${compat_template}"

# --- ValidatingAdmissionPolicy: the controller only lifts its gate --------
POD_POLICY=gpulink-controller-pods
log "waiting for the ValidatingAdmissionPolicy ${POD_POLICY} to take effect"
for _ in $(seq 60); do
	if ! as_controller -n gate-test label --dry-run=server pod no-claims probe=1 >/dev/null 2>&1; then
		break
	fi
	sleep 0.5
done
# expect_policy_denies DESCRIPTION COMMAND...: COMMAND must fail, and
# because of ${POD_POLICY} (RBAC would allow it).
expect_policy_denies() {
	local what=$1 out
	shift
	if out=$("$@" 2>&1); then
		fail "allowed, want denied by ${POD_POLICY}: ${what}"
	elif [[ "${out}" == *"ValidatingAdmissionPolicy '${POD_POLICY}'"* ]]; then
		log "ok: denied: ${what} (${out##*denied request: })"
	else
		fail "denied, but not by ${POD_POLICY}: ${what}: ${out}"
	fi
}
# json_patch_pod TOKEN POD PATCH: a JSON patch of a pod in gate-test with
# TOKEN's identity ("" = admin).
json_patch_pod() {
	local auth=()
	[[ -n "$1" ]] && auth=(--token "$1")
	kc "${auth[@]}" -n gate-test patch pod "$2" --type=json -p "$3"
}
# other-gate carries [example.com/other, gpu.gpulink.dev/allocation].
OTHER_UID=$(kc -n gate-test get pod other-gate -o jsonpath='{.metadata.uid}')
expect_policy_denies "controller adds a label to a pod" \
	as_controller -n gate-test label pod other-gate evil=true
expect_policy_denies "controller changes a pod's container image" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"replace","path":"/spec/containers/0/image","value":"registry.example.com/evil:1"}]'
expect_policy_denies "controller adds a toleration to a pod" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"add","path":"/spec/tolerations/-","value":{"key":"dedicated","operator":"Exists"}}]'
expect_policy_denies "controller adds a node selector to a gated pod" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"add","path":"/spec/nodeSelector","value":{"kubernetes.io/hostname":"node-a"}}]'
expect_policy_denies "controller removes another component's scheduling gate" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"remove","path":"/spec/schedulingGates/0"}]'
expect_policy_denies "controller sets an annotation outside gpu.gpulink.dev/" \
	as_controller -n gate-test annotate pod other-gate example.com/note=x
expect_policy_denies "controller adds a finalizer to a pod" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"add","path":"/metadata/finalizers","value":["example.com/hold"]}]'
expect_policy_denies "controller lifts its gate and adds a label in one patch" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"remove","path":"/spec/schedulingGates/1"},{"op":"add","path":"/metadata/labels","value":{"evil":"true"}}]'
expect allow "controller sets an annotation under gpu.gpulink.dev/ (the policy's allow-list)" \
	as_controller -n gate-test annotate pod other-gate gpu.gpulink.dev/note=x
expect allow "controller removes its annotation again" \
	as_controller -n gate-test annotate pod other-gate gpu.gpulink.dev/note-
# The patch that records the nodes a pod was unschedulable on
# (controller/exclude.go): a merge patch of that annotation, UID as precondition.
expect allow "controller records excluded nodes on a pod" \
	as_controller -n gate-test patch pod other-gate --type=merge \
	-p "{\"metadata\":{\"uid\":\"${OTHER_UID}\",\"annotations\":{\"gpu.gpulink.dev/excluded-nodes\":\"node-a,node-b\"}}}"
expect allow "controller clears excluded nodes" \
	as_controller -n gate-test patch pod other-gate --type=merge \
	-p "{\"metadata\":{\"uid\":\"${OTHER_UID}\",\"annotations\":{\"gpu.gpulink.dev/excluded-nodes\":null}}}"
# The patch the controller sends (controller/gate.go): test the UID and the
# gate's name at its index, then remove it.
expect allow "controller lifts its gate and leaves the other gate" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate "[{\"op\":\"test\",\"path\":\"/metadata/uid\",\"value\":\"${OTHER_UID}\"},
		{\"op\":\"test\",\"path\":\"/spec/schedulingGates/1/name\",\"value\":\"${GATE}\"},
		{\"op\":\"remove\",\"path\":\"/spec/schedulingGates/1\"}]"
expect_gates other-gate "example.com/other "
expect allow "controller sends a patch that changes nothing" \
	json_patch_pod "${CONTROLLER_TOKEN}" other-gate '[{"op":"test","path":"/metadata/name","value":"other-gate"}]'
expect allow "another identity (admin) still changes labels, images and gates" \
	json_patch_pod "" other-gate '[{"op":"add","path":"/metadata/labels","value":{"app":"x"}},
		{"op":"replace","path":"/spec/containers/0/image","value":"registry.k8s.io/pause:3.9"},
		{"op":"remove","path":"/spec/schedulingGates/0"}]'

if ((FAILED)); then
	die "policy checks failed"
fi
log "admission policies and RBAC OK"

// Package admission serves the mutating admission webhook that runs
// compat's translation on every new pod, and does the API work around it:
// it creates the ResourceClaimTemplates a translated pod needs (before
// the pod is admitted, so a stored pod never lacks its template), records
// a Normal event on each translated pod (from the leader, since at
// admission a pod has no UID and maybe no name), and garbage-collects the
// templates (Collector).
//
// Every controller replica serves the webhook: the webhook Service
// balances over all of them and decisions do not depend on the lease.
// The leader records the events and collects templates.
//
// Gating: the chart's MutatingAdmissionPolicy gates pods that have
// spec.resourceClaims when it runs, and has reinvocationPolicy Never;
// admission runs policies before webhooks, so a pod whose claims the
// webhook adds would not be gated. The translation therefore adds the
// gate itself (only when absent and the pod is not bound at creation).
//
// Garbage collection: a template is deleted when no pod in its namespace
// references it and no pod was admitted with it for the grace period.
// The webhook stamps AnnotationLastAdmitted on the template it uses
// (refreshing it once a quarter of the grace has passed), and the
// collector deletes with a resourceVersion precondition, so a pod being
// admitted while the collector runs either refreshes the template first
// (the delete then conflicts) or finds it gone and creates it again
// before the pod is stored.
//
// failurePolicy (chart value compat.failurePolicy): Fail refuses pods
// with the configured resources while no replica answers (nothing is
// created half-way); Ignore admits them untranslated, and they then wait
// for a device plugin that is not there (Pending, no event from gpulink).
// The webhook's objectSelector/matchConditions confine it to pods, and a
// pod without translated resources is answered without any API call.
package admission

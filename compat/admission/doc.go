// Package admission serves the mutating admission webhook that runs
// compat's translation on every new pod, and does the API work around it
// in the controller's leader: it creates the ResourceClaimTemplates
// translated pods need (TemplateMaker), records a Normal event on each
// translated pod (at admission a pod has no UID and maybe no name), and
// garbage-collects the templates (Collector).
//
// Every controller replica serves the webhook: the webhook Service
// balances over all of them and decisions do not depend on the lease.
//
// No side effects in the webhook: anyone who reaches its port can POST an
// AdmissionReview (the API server does not authenticate to webhooks by
// default), so the webhook only answers with a patch (sideEffects: None).
// The patch names the pod's templates and carries their specs in the
// annotation compat.AnnotationTemplates; the leader creates them for pods
// that exist, in the pod's namespace, only under the name that is the hash
// of the spec and only for specs of the translation's form. A forged
// annotation therefore makes the leader create at most what the namespace's
// users could create themselves. kube-controller-manager's resourceclaim
// controller creates the pod's claims once the template exists (it watches
// templates); the pod is gated meanwhile.
//
// Pre-created templates: template names are predictable, so a namespace
// user may create one under a translated name with another spec. A
// template whose stored spec does not hash to its name is never used (the
// pod gets a CompatTemplateConflict Warning, and the controller refuses
// to allocate a claim made from it) and never collected.
//
// Quota: ResourceQuota is charged after mutating admission, so a quota on
// requests.nvidia.com/gpu would not count a translated pod's GPUs, which
// come through claims. The webhook (and the leader, for pods that carry
// the annotation without having been translated) refuses to translate in
// a namespace whose quota limits a translated name unless a quota there
// also limits <class>.deviceclass.resource.k8s.io/devices for each class
// the pod's claims use (QuotaGuard).
//
// Gating: the chart's MutatingAdmissionPolicy gates pods that have
// spec.resourceClaims when it runs, and has reinvocationPolicy Never;
// admission runs policies before webhooks, so a pod whose claims the
// webhook adds would not be gated. The translation therefore adds the
// gate itself (only when absent and the pod is not bound at creation).
//
// Garbage collection: a template is deleted when no pod in its namespace
// references it and no new pod used it for the grace period (the leader
// stamps AnnotationLastAdmitted). Should the collector delete a template
// a new pod needs, the leader sees the deletion and creates it again for
// that pod.
//
// failurePolicy (chart value compat.failurePolicy): Fail refuses pods
// with the configured resources while no replica answers; Ignore admits
// them untranslated, and they then wait for a device plugin that is not
// there (Pending, no event from gpulink). The webhook's
// objectSelector/matchConditions confine it to pods, and a pod without
// translated resources is answered without any API call.
package admission

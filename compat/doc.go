// Package compat translates pods written for GPU device plugins into
// gpulink resource claims: the extended resources of the NVIDIA device
// plugin and HAMi (nvidia.com/gpu, gpumem, gpumem-percentage, gpucores,
// and HAMi's task priority nvidia.com/priority, which becomes the claim's
// opaque GpuConfig sharing.priority),
// of the gputopology scheduler extender (aliyun.com/gpu) and of TKEStack
// gpu-manager (tencent.com/vcuda-core, vcuda-memory), and HAMi's pod
// annotations that pick GPUs. It is pure (no API calls): the admission
// webhook in compat/admission feeds it pods and the GPU inventory and
// writes what it returns; the templates' specs travel in the pod's
// annotation AnnotationTemplates, from which the controller's leader
// creates them.
//
// Each container (and init container) asking for GPUs gets its own entry
// in pod.spec.resourceClaims, created from a ResourceClaimTemplate per
// distinct request shape (named TemplatePrefix + a hash of its claim spec
// as the API server stores it, TemplateName, so pods asking the same in
// one namespace share it, a template never changes, and one whose stored
// spec does not hash to its name is known not to be the translation's),
// and the extended resources are removed from its limits and
// requests. Whole GPUs come from the whole-GPU class with count N (the
// controller picks a link-minimal set); shares from the share class with
// capacity requests memory and cores per GPU (HAMi's gpumem is per GPU,
// so nvidia.com/gpu: 2 + gpumem: 8000 is one request of count 2 with
// 8000Mi of capacity: two shares of 8000Mi, which the controller places on
// two different GPUs). Such a claim works under either share strategy:
// under MPS the kubelet plugin runs one control daemon for the claim that
// serves both GPUs with a pinned memory limit on each, under HAMi-core
// the container gets a limit per GPU. gpumem-percentage becomes one firstAvailable
// alternative per GPU memory size in the cluster, since DRA capacity
// requests are absolute. A share dimension left out takes the share
// class's default size (HAMi gives the whole GPU's memory / unlimited
// cores instead): shares are accounted, never unbounded.
//
// The NVIDIA device plugin's mixed-strategy MIG resources
// (NVIDIAFamily.MIGPrefix + profile, nvidia.com/mig-1g.10gb: N) become N
// MIG devices of the MIG class selected by profile, one request per
// profile of the container (named "gpu", "gpu-1", ... in profile order).
// A container asks for MIG devices or for whole GPUs and shares, never
// both (its one claim is placed by one planner); the containers of a pod
// may differ.
//
// Bad values (a count of 0 with memory, negative or fractional values,
// cores outside 1..100, a priority other than 0 or 1 or without a GPU,
// memory larger than any known GPU, a MIG resource whose profile is not
// a MIG profile name or beside other GPU resources, requests
// differing from limits, two families in one container, unknown or
// malformed HAMi annotations) are errors naming the container, the
// resource and the value; nothing is translated then. Resource names and
// families are configuration (Config, strictly decoded).
package compat

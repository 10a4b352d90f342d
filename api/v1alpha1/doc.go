// Package v1alpha1 is the opaque configuration that a DeviceClass or a
// ResourceClaim passes to the gpulink DRA driver (driver name
// gpu.gpulink.dev) in its `config[].opaque.parameters`.
//
// A full example, as it appears in a ResourceClaim:
//
//	spec:
//	  devices:
//	    requests:
//	    - name: gpus
//	      exactly:
//	        deviceClassName: gpu.gpulink.dev
//	        count: 4
//	    config:
//	    - requests: [gpus]
//	      opaque:
//	        driver: gpu.gpulink.dev
//	        parameters:
//	          apiVersion: gpu.gpulink.dev/v1alpha1
//	          kind: GpuConfig
//	          topology:
//	            policy: Required   # BestEffort (default) or Required
//	            minLink: NVLink    # NVLink, NV1..NV18, PIX, PXB, PHB, NODE or SYS
//	          sharing:
//	            strategy: MPS      # MPS (default), HAMiCore or None; a claim may only repeat its class's
//	            defaultMemory: 4Gi
//	            defaultCores: 25
//	            maxSharesPerGPU: 8 # at most the class's (default 16)
//	            priority: 1        # 0 (high) or 1 (low), HAMi's nvidia.com/priority; unset: the mechanism's default
//
// Configs are read in layers: the DeviceClass's first, then the claim's, each
// later layer overriding the earlier one field by field (see Merge). Resolve
// does the whole pipeline (Decode each layer, check the claim's against the
// class's, Merge, Default, Validate); Normalize does it for a single layer.
//
// A claim may only narrow the settings that protect the other tenants of a
// GPU, because anyone who may create a claim writes its config while the
// DeviceClass is the cluster operator's (see CheckClaimNarrows):
// sharing.strategy must equal the class's effective strategy (the default,
// MPS, where the class sets none), and sharing.maxSharesPerGPU may not
// exceed the class's (default 16). A claim that sets HAMiCore, None or a
// higher cap under an MPS class is refused with an error naming the field,
// the claim's value and the class's; the controller then leaves the pod
// gated with a ClaimNotAllocatable event, and the kubelet plugin refuses to
// prepare such a claim whoever allocated it. Offer another strategy or a
// higher cap through a DeviceClass of its own. The topology settings, the
// share sizes and the task priority are the claim's own business and may be
// set freely.
//
// Fields that the selected policy or strategy does not use (minLink under
// BestEffort, the share sizes under strategy None) are still checked for
// well-formedness but otherwise ignored. Rejecting them would make layering
// impossible: a claim that relaxes a class's Required policy to BestEffort
// cannot remove the class's minLink, because a layer can only set fields.
package v1alpha1

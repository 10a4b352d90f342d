// Package mps runs the NVIDIA MPS control daemons of the kubelet plugin's
// MPS claims: one daemon per claim (Manager counts the claim's references
// and starts and stops it), run in a pod per claim on the node (PodDaemon)
// or as a host process (HostDaemon, for gpu-check), with the claim's
// memory and thread limits set on the daemon and set again periodically
// (LimitEnforcer); and the small kubelet device plugin (DevicePlugin) that
// gives the unprivileged daemon pods exactly their GPUs' device nodes.
//
// It knows nothing of DRA: the kubelet plugin (package kubeletplugin)
// turns prepared claims into Shares and asks the Manager for their
// daemons. Where the daemons run, what they guarantee and what they do
// not is described in kubeletplugin's doc.go ("MPS daemons") and the
// README ("What MPS guarantees").
package mps

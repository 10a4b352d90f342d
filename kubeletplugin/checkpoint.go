package kubeletplugin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
)

// CheckpointFile is the name of the checkpoint inside the plugin data directory.
const CheckpointFile = "checkpoint.json"

// checkpointVersion is bumped whenever Checkpoint changes incompatibly.
const checkpointVersion = "gpulink.kubeletplugin/v1"

// ClaimState is how far preparing a claim got.
type ClaimState string

const (
	// PrepareStarted is recorded before any side effect (MPS daemon, CDI
	// spec); a claim found in this state after a restart is rolled back.
	PrepareStarted ClaimState = "PrepareStarted"
	// PrepareCompleted means the CDI spec is written and the claim is
	// served from the checkpoint from then on.
	PrepareCompleted ClaimState = "PrepareCompleted"
)

// Checkpoint is everything the plugin must remember across restarts.
type Checkpoint struct {
	Version string `json:"version"`
	// BootID is the node's boot ID when the checkpoint was written; claims
	// prepared in an earlier boot are void (device nodes, MPS daemons and
	// the tmpfs CDI directory are gone).
	BootID string                       `json:"bootID"`
	Claims map[types.UID]*PreparedClaim `json:"claims"`
	// OnDemandGPUs are the UUIDs of the GPUs partitioned on demand whose
	// every MIG instance is gpulink's (ondemand.go), sorted.
	OnDemandGPUs []string `json:"onDemandGPUs,omitempty"`
	// WithheldGPUs are the UUIDs of GPUs named by --mig-on-demand that
	// had MIG instances when a corrupt checkpoint lost whose they were:
	// running pods may use them, so they are neither destroyed nor
	// published (as static devices they would go to a second tenant)
	// until the GPU has none left (ondemand.go), sorted.
	WithheldGPUs []string `json:"withheldGPUs,omitempty"`
}

// PreparedClaim is one claim the plugin prepared (or started to).
type PreparedClaim struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	// CDIDeviceID is the qualified CDI device of the claim ("" when the
	// claim has no devices of this driver).
	CDIDeviceID string           `json:"cdiDeviceID,omitempty"`
	Devices     []PreparedDevice `json:"devices,omitempty"`
	// ContainerPeers are the GPUs of the claims its containers use with
	// it (containergroup.go): its spec numbers them and its own as one set.
	ContainerPeers []PreparedDevice `json:"containerPeers,omitempty"`
	// Pods are the pods in the claim's reservedFor when the kubelet last
	// asked for it, for the per-pod metrics (podmetrics.go).
	Pods []PreparedPod `json:"pods,omitempty"`
}

// PreparedDevice is one allocation result of a prepared claim.
type PreparedDevice struct {
	// Request is the result's request name (with subrequest, if any).
	Request     string     `json:"request"`
	Pool        string     `json:"pool"`
	Device      string     `json:"device"`
	Index       int        `json:"index"`
	Minor       int        `json:"minor"`
	UUID        string     `json:"uuid,omitempty"`
	PCIBusID    string     `json:"pciBusID,omitempty"`
	ShareID     *types.UID `json:"shareID,omitempty"`
	AdminAccess bool       `json:"adminAccess,omitempty"`
	// Share is set for a share of the GPU, nil for the whole GPU.
	Share *PreparedShare `json:"share,omitempty"`
	// MIG is set for a MIG device of the GPU (prepare_mig.go); UUID is
	// then the MIG device's.
	MIG *PreparedMIG `json:"mig,omitempty"`
	// CDIDeviceID is the qualified CDI device of this GPU in the claim's
	// spec (CDIDeviceIDForDevice; the same for every share of one GPU),
	// first in the device's CDI IDs. Empty in claims prepared by versions
	// without per-GPU CDI devices: their spec has the claim device only,
	// and they keep it (PreparedClaim.perGPUCDI).
	CDIDeviceID string `json:"cdiDeviceID,omitempty"`
}

// perGPUCDI says whether the claim's spec has a CDI device per GPU: true
// for every claim prepared since they exist, false for claims a checkpoint
// of an earlier version recorded (no device has its CDIDeviceID). Such a
// claim is answered and, when its spec must be restored, written as it
// was: the kubelet may still start containers with the CDI IDs it got
// then, whose claim device must keep holding the GPUs' device nodes.
func (pc *PreparedClaim) perGPUCDI() bool {
	if len(pc.Devices) == 0 {
		return false
	}
	for _, d := range pc.Devices {
		if d.CDIDeviceID == "" {
			return false
		}
	}
	return true
}

// PreparedShare is the part of a GPU one share gets.
type PreparedShare struct {
	MemoryBytes int64                       `json:"memoryBytes"`
	Cores       int64                       `json:"cores"`
	Strategy    apiv1alpha1.SharingStrategy `json:"strategy"`
	// MemoryOvercommitPercent is the share's class's memory over-commit
	// opt-in (0 or 100: none): the shares of the GPU may add up to this
	// percentage of its memory when this share joins them.
	MemoryOvercommitPercent int `json:"memoryOvercommitPercent,omitempty"`
	// Priority is the share's task priority (sharing.priority, 0 or 1);
	// nil: unset. Checkpoints written before it existed read as unset.
	Priority *int `json:"priority,omitempty"`
	// MPSMode is Concurrent for a share under strategy MPS whose class
	// chose sharing.mpsMode Concurrent: it references its namespace's MPS
	// daemon on its GPU, not a daemon of its claim's own. Empty means
	// Isolated (written so, a checkpoint of Isolated claims stays readable
	// by versions without the field).
	MPSMode apiv1alpha1.MPSMode `json:"mpsMode,omitempty"`
	// MPSRef is true while the claim holds a reference to its MPS control
	// daemon (strategy MPS): the claim's own, or its group's on the GPU
	// (Concurrent). Refcounts are rebuilt from it, so the references of a
	// group's daemon are the MPSRefs of all the group's claims on the GPU.
	MPSRef bool `json:"mpsRef,omitempty"`
}

// concurrentMPS tells whether the share is served by its group's MPS
// daemon on its GPU (sharing.mpsMode Concurrent).
func (s *PreparedShare) concurrentMPS() bool {
	return s != nil && s.Strategy == apiv1alpha1.SharingMPS && s.MPSMode == apiv1alpha1.MPSConcurrent
}

// checkpointFile is the on-disk envelope: the checksum covers the exact
// bytes of Data, so a torn or edited file is detected before it is trusted.
type checkpointFile struct {
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// ErrCorruptCheckpoint marks a checkpoint that cannot be trusted.
var ErrCorruptCheckpoint = errors.New("corrupt checkpoint")

// ErrCheckpointVersion marks a sound checkpoint (its checksum matches) of
// another version than checkpointVersion: a newer plugin wrote it, and a
// rollback brought this one. It describes claims that pods may still use,
// which this version cannot interpret, so it is neither used nor
// destroyed.
var ErrCheckpointVersion = errors.New("checkpoint of another version")

// CheckpointStore reads and writes the checkpoint file. The kubelet's
// checkpointmanager lives in k8s.io/kubernetes, which gpulink must not
// import, and neither k8s.io/kubelet nor k8s.io/dynamic-resource-allocation
// export one, so this follows the same design: a checksum over the
// payload, written to a temporary file and atomically renamed (see Store
// for why it is not synced).
type CheckpointStore struct {
	path string
	// last is the file's content as last read or written here, so that a
	// plugin instance sees when another one wrote it (rolling.go).
	last []byte
}

// NewCheckpointStore keeps the checkpoint in dir.
func NewCheckpointStore(dir string) *CheckpointStore {
	return &CheckpointStore{path: filepath.Join(dir, CheckpointFile)}
}

// Path is the checkpoint file's path.
func (s *CheckpointStore) Path() string { return s.path }

// Load returns the stored checkpoint, an empty one when there is none, or
// an error wrapping ErrCorruptCheckpoint when the file is unreadable JSON,
// fails its checksum or has fields this version does not know, or
// ErrCheckpointVersion when another version wrote it. Strict, because
// during a rolling update the other instance may be a newer version: a
// write of what this one decoded would drop that version's fields.
func (s *CheckpointStore) Load() (*Checkpoint, error) {
	cp, _, err := s.load(false)
	return cp, err
}

// LoadTolerant is Load for the plugin's start, which may follow a rollback
// from a newer version: fields this version does not know are ignored
// rather than making the checkpoint corrupt (which would tear down every
// claim that running pods use), and unknown describes them ("" when there
// were none). The file is left as it is; the next Store drops them.
func (s *CheckpointStore) LoadTolerant() (cp *Checkpoint, unknown string, err error) {
	return s.load(true)
}

func (s *CheckpointStore) load(tolerant bool) (*Checkpoint, string, error) {
	raw, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		s.last = nil
		return newCheckpoint(""), "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading checkpoint %s: %w", s.path, err)
	}
	var f checkpointFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, "", fmt.Errorf("checkpoint %s: %w: %w", s.path, ErrCorruptCheckpoint, err)
	}
	if len(f.Data) == 0 {
		return nil, "", fmt.Errorf("checkpoint %s: %w: no data", s.path, ErrCorruptCheckpoint)
	}
	if sum := checksum(f.Data); sum != f.Checksum {
		return nil, "", fmt.Errorf("checkpoint %s: %w: checksum %q does not match content (%q)", s.path, ErrCorruptCheckpoint, f.Checksum, sum)
	}
	// The version first: another version's data need not decode as ours.
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(f.Data, &head); err != nil {
		return nil, "", fmt.Errorf("checkpoint %s: %w: %w", s.path, ErrCorruptCheckpoint, err)
	}
	if head.Version != checkpointVersion {
		return nil, "", fmt.Errorf("checkpoint %s: %w: version %q, this plugin reads %q", s.path, ErrCheckpointVersion, head.Version, checkpointVersion)
	}
	var cp Checkpoint
	var unknown string
	dec := json.NewDecoder(bytes.NewReader(f.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cp); err != nil {
		if !tolerant {
			return nil, "", fmt.Errorf("checkpoint %s: %w: %w", s.path, ErrCorruptCheckpoint, err)
		}
		cp = Checkpoint{}
		if lerr := json.Unmarshal(f.Data, &cp); lerr != nil {
			return nil, "", fmt.Errorf("checkpoint %s: %w: %w", s.path, ErrCorruptCheckpoint, lerr)
		}
		// The strict decode failed only on what it did not know.
		unknown = err.Error()
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]*PreparedClaim{}
	}
	for uid, c := range cp.Claims {
		if c == nil || c.UID != uid {
			return nil, "", fmt.Errorf("checkpoint %s: %w: entry %q does not describe claim %q", s.path, ErrCorruptCheckpoint, uid, uid)
		}
	}
	s.last = raw
	return &cp, unknown, nil
}

// Store writes cp atomically: a reader sees the old or the new checkpoint,
// never a mix.
//
// It does not fsync. Within one boot the page cache is coherent, so a
// plugin crash or restart reads what was renamed into place; only a power
// loss or kernel crash could lose or tear the file, and both mean a new
// boot, which voids the whole checkpoint anyway (the boot ID changes;
// a torn file is also caught by the checksum). Syncing would quadruple the
// cost of a prepare for no gain.
func (s *CheckpointStore) Store(cp *Checkpoint) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("encoding checkpoint: %w", err)
	}
	raw, err := json.Marshal(checkpointFile{Checksum: checksum(data), Data: data})
	if err != nil {
		return fmt.Errorf("encoding checkpoint: %w", err)
	}
	if err := writeFileAtomic(s.path, raw); err != nil {
		return fmt.Errorf("writing checkpoint %s: %w", s.path, err)
	}
	s.last = raw
	return nil
}

// MoveAside renames a corrupt checkpoint to <name>.corrupt (replacing an
// older one) so it stays available for a post-mortem, and returns the new
// path.
func (s *CheckpointStore) MoveAside() (string, error) {
	to := s.path + ".corrupt"
	if err := os.Rename(s.path, to); err != nil {
		return "", fmt.Errorf("moving corrupt checkpoint aside: %w", err)
	}
	return to, nil
}

// newerCheckpointSuffix names the copy of a checkpoint with fields this
// version does not know (CheckpointStore.KeepCopy).
const newerCheckpointSuffix = ".newer"

// KeepCopy copies the checkpoint file as last read to <name><suffix>
// (replacing an older copy) and returns the copy's path.
func (s *CheckpointStore) KeepCopy(suffix string) (string, error) {
	to := s.path + suffix
	if s.last == nil {
		return "", fmt.Errorf("copying checkpoint %s: nothing was read", s.path)
	}
	if err := writeFileAtomic(to, s.last); err != nil {
		return "", fmt.Errorf("copying checkpoint %s to %s: %w", s.path, to, err)
	}
	return to, nil
}

func newCheckpoint(bootID string) *Checkpoint {
	return &Checkpoint{Version: checkpointVersion, BootID: bootID, Claims: map[types.UID]*PreparedClaim{}}
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeFileAtomic writes data to a temporary file next to path and
// renames it over path.
func writeFileAtomic(path string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// BootIDReader returns the node's current boot ID.
type BootIDReader func() (string, error)

// FileBootID reads the boot ID from a file such as
// /proc/sys/kernel/random/boot_id.
func FileBootID(path string) BootIDReader {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("reading boot ID: %w", err)
		}
		id := strings.TrimSpace(string(b))
		if id == "" {
			return "", fmt.Errorf("reading boot ID: %s is empty", path)
		}
		return id, nil
	}
}

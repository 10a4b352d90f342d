package admission

import (
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpulink/gpulink/internal/sliceformat"
)

// Inventory keeps the distinct GPU memory sizes that gpulink's
// ResourceSlices publish (whole GPUs, not MIG devices; read with
// sliceformat), for the checks and the gpumem-percentage alternatives of
// the translation (compat.Inventory).
type Inventory struct {
	mu    sync.Mutex
	slice map[string][]int64 // slice name -> memory sizes
	sizes []int64
}

// NewInventory returns an inventory fed by a ResourceSlice informer.
func NewInventory(informer cache.SharedIndexInformer) (*Inventory, error) {
	inv := &Inventory{slice: map[string][]int64{}}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { inv.set(o) },
		UpdateFunc: func(_, o any) { inv.set(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := o.(*resourceapi.ResourceSlice); ok {
				inv.update(s.Name, nil)
			}
		},
	})
	return inv, err
}

func (inv *Inventory) set(o any) {
	s, ok := o.(*resourceapi.ResourceSlice)
	if !ok {
		return
	}
	sizes := sliceformat.WholeGPUMemory(s)
	inv.update(s.Name, sizes)
}

func (inv *Inventory) update(name string, sizes []int64) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if len(sizes) == 0 {
		delete(inv.slice, name)
	} else {
		inv.slice[name] = sizes
	}
	var all []int64
	for _, s := range inv.slice {
		all = append(all, s...)
	}
	slices.Sort(all)
	inv.sizes = slices.Compact(all)
}

// MemorySizes implements compat.Inventory.
func (inv *Inventory) MemorySizes() []int64 {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return slices.Clone(inv.sizes)
}

package controller

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	apitypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/driver/topology"
)

// fakeClassLister serves DeviceClasses from a map.
type fakeClassLister map[string]*resourceapi.DeviceClass

func (f fakeClassLister) List(labels.Selector) ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range f {
		out = append(out, c)
	}
	return out, nil
}

func (f fakeClassLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := f[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

func parseFixture(name string) (*topology.Topology, error) {
	return topology.ParseFile("../driver/topology/testdata/" + name)
}

// testUID returns a distinct claim UID for tests.
func testUID(i int) apitypes.UID { return apitypes.UID(fmt.Sprintf("uid-%d", i)) }

package allocate

import (
	"reflect"
	"sync"
	"testing"
)

// TestConcurrentCalls runs Allocate and ChooseNode from many goroutines on
// shared nodes (the controller does) and expects the sequential answers;
// under -race it also checks that scratch buffers are never shared.
func TestConcurrentCalls(t *testing.T) {
	nodes := []*NodeState{
		nodeWith("a", v100(t), 1),
		nodeWith("b", pcie16(t), 0, 5),
		nodeWith("c", synthetic32(t), 3, 9),
		nodeWith("d", nvlinkTiered(t), 2),
	}
	reqs := []Request{{GPUs: 1}, {GPUs: 2}, {GPUs: 4}, {GPUs: 8}, share(4, 20)}
	type answer struct {
		res Result
		err string
	}
	call := func(i int) answer {
		req := reqs[i%len(reqs)]
		var res Result
		var err error
		if i%3 == 0 {
			res, err = ChooseNode(nodes, req, Policy{})
		} else {
			res, err = Allocate(nodes[i%len(nodes)], req, Policy{})
		}
		if err != nil {
			return answer{err: err.Error()}
		}
		return answer{res: res}
	}
	const calls = 60
	want := make([]answer, calls)
	for i := range want {
		want[i] = call(i)
	}
	var wg sync.WaitGroup
	got := make([][]answer, 8)
	for g := range got {
		got[g] = make([]answer, calls)
		wg.Go(func() {
			for i := range calls {
				got[g][i] = call(i)
			}
		})
	}
	wg.Wait()
	for g := range got {
		if !reflect.DeepEqual(got[g], want) {
			t.Fatalf("goroutine %d got different answers than the sequential run", g)
		}
	}
}

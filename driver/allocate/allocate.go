package allocate

// Allocate chooses GPUs on one node: k whole GPUs, or one GPU for a share.
// It does not change node; Commit does. Invalid input yields a plain error,
// a valid request that cannot be met an *UnsatisfiableError.
func Allocate(node *NodeState, req Request, pol Policy) (Result, error) {
	if err := checkInput(node, req, pol); err != nil {
		return Result{}, err
	}
	if req.Share != nil {
		return allocateShare(node, req, pol)
	}
	return allocateWhole(node, req, pol.Mix)
}

func checkInput(node *NodeState, req Request, pol Policy) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := pol.Validate(); err != nil {
		return err
	}
	if err := node.Validate(); err != nil {
		return err
	}
	return checkEligible(node, req)
}

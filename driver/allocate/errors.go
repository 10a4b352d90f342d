package allocate

// UnsatisfiableError says a valid request cannot be met with the current
// usage. Callers tell it apart from invalid input with errors.As: an
// unsatisfiable request may succeed later, an invalid one never will.
type UnsatisfiableError struct {
	// Node is the node that was searched; empty when the search spanned
	// a cluster (ChooseNode).
	Node string
	// Reason is a complete human sentence naming the request and the best
	// that was available, e.g. "no 4 free GPUs with every pair NVLink on
	// node-a (best free set of 4: weakest link SYS)".
	Reason string
}

func (e *UnsatisfiableError) Error() string { return e.Reason }

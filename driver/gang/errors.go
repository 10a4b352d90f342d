package gang

import (
	"fmt"
	"strings"
)

// UnplaceableError says a valid gang does not fit now; it may fit later.
// Callers tell it apart from invalid input (ErrInvalid) with errors.As.
type UnplaceableError struct {
	Gang       string
	Pods       int
	MinCount   int
	GPUsPerPod int
	// Level and LevelName are the level the gang had to stay within:
	// Request.Level under Required, else the cluster.
	Level     int
	LevelName string
	// Constraint is the request's (None, Preferred or Required).
	Constraint Constraint
	// MostInOne is the most pods that fit in one domain of Level.
	MostInOne int
	// FitsHigher is true when, under Required, the gang would fit at a
	// higher level: HigherLevel, across HigherDomains domains of Level
	// (the message's "2 leaves would fit under Preferred").
	FitsHigher    bool
	HigherLevel   int
	HigherDomains int
	// Plural is Level's plural name, for the message.
	Plural string
}

func (e *UnplaceableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gang %s: %d pods", e.Gang, e.Pods)
	if e.MinCount > 0 && e.MinCount < e.Pods {
		fmt.Fprintf(&b, " (at least %d)", e.MinCount)
	}
	fmt.Fprintf(&b, " × %d GPUs: ", e.GPUsPerPod)
	in := "one " + e.LevelName
	switch e.LevelName {
	case "cluster":
		in = "the cluster"
	case "node":
		in = "one node"
	}
	if e.MostInOne == 0 {
		fmt.Fprintf(&b, "none fit in %s", in)
	} else {
		fmt.Fprintf(&b, "only %d fit in %s", e.MostInOne, in)
	}
	if e.FitsHigher {
		fmt.Fprintf(&b, "; %d %s would fit under Preferred", e.HigherDomains, e.Plural)
	}
	return b.String()
}

package planner

// HeldOff is other drivers' devices a decision or a count takes as held
// besides the ledger's holds: an aligned gang's NICs of the rails its
// pods do not use (the controller's rail keys). They are held off in the
// planning only, not in the ledger: a hold there would move the holds'
// generation of every node it touches, and nothing kept for those nodes
// (a waiting pod's nodes without room, a gang's counts) would be valid
// for the next retry, which holds them off again.
type HeldOff struct {
	// On returns node's test of its devices held off, nil for none there.
	// It is called for nodes planned at once (parallel.go): it must be
	// safe for concurrent use, and so must what it returns.
	On func(node string) func(DeviceKey) bool
	// Key names what On holds off, for the answers kept under it: one
	// key must always mean the same devices of a node's other drivers'
	// devices as they are (a node's answers are kept for its ForeignNode).
	// Without a key nothing is kept.
	Key string
}

// set tells whether anything is held off.
func (h HeldOff) set() bool { return h.On != nil }

// heldOn is node's test of other drivers' devices held: the ledger's
// holds, and what h holds off there.
func (p *Planner) heldOn(h HeldOff, node string) func(DeviceKey) bool {
	if !h.set() {
		return p.ledger.ForeignHeld
	}
	off := h.On(node)
	if off == nil {
		return p.ledger.ForeignHeld
	}
	return func(k DeviceKey) bool { return p.ledger.ForeignHeld(k) || off(k) }
}

// keptUnder is the key answers are kept under for claims keyed key when
// h holds devices off: "" (nothing kept) when h holds some off without a
// key of its own.
func (h HeldOff) keptUnder(key string) string {
	switch {
	case !h.set() || key == "":
		return key
	case h.Key == "":
		return ""
	}
	return key + "\x05" + h.Key
}

package cli

import (
	"strconv"
	"strings"
)

// problemList is every problem found in one input, so users fix a file in
// one pass instead of one error per run.
type problemList []error

// joinProblems returns nil for no problems, the problem itself for one, and
// a flat problemList for more (nested lists are spliced in, nils dropped).
func joinProblems(errs []error) error {
	var kept problemList
	for _, err := range errs {
		// Only a bare problemList is spliced in: a wrapped one carries
		// context of its own and stays a single problem.
		switch e := err.(type) { //nolint:errorlint // the exact type is meant, see above
		case nil:
		case problemList:
			kept = append(kept, e...)
		default:
			kept = append(kept, err)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return kept
}

func (p problemList) Error() string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(p)))
	b.WriteString(" problems:")
	for _, err := range p {
		b.WriteString("\n  - ")
		b.WriteString(strings.ReplaceAll(err.Error(), "\n", "\n    "))
	}
	return b.String()
}

// Unwrap lets errors.Is and errors.As see each problem.
func (p problemList) Unwrap() []error { return p }

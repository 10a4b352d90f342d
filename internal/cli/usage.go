package cli

import (
	"errors"
	"strings"

	"github.com/spf13/cobra"
)

// usageError marks a mistake in how a command was called (a bad flag, the
// wrong number of arguments), after which pointing at --help helps, as
// opposed to a failure of a well-formed command.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usageArgs marks the errors of an argument validator as usage errors.
func usageArgs(validate cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := validate(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// flagUsageError is the root's flag error function, inherited by every
// subcommand.
func flagUsageError(_ *cobra.Command, err error) error { return usageError{err} }

// isUsageError also recognizes an unknown subcommand, which cobra reports
// before any hook of ours runs, by its wording.
func isUsageError(err error) bool {
	var u usageError
	return errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command ")
}

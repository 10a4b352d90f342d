package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

// createTSV creates the file a flag names for a tab-separated log and
// writes its header line; the function returned flushes and closes it.
// Errors name the flag and the path.
func createTSV(flag, path, header string) (io.Writer, func() error, error) {
	fh, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", flag, err)
	}
	w := bufio.NewWriter(fh)
	closeLog := func() error {
		ferr := w.Flush()
		if cerr := fh.Close(); ferr == nil {
			ferr = cerr
		}
		if ferr != nil {
			return fmt.Errorf("%s %s: %w", flag, path, ferr)
		}
		return nil
	}
	if _, err := io.WriteString(w, header+"\n"); err != nil {
		_ = closeLog()
		return nil, nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return w, closeLog, nil
}

// closeTSV runs a log's close (createTSV's) for a deferred call, keeping
// *err when it is already set.
func closeTSV(err *error, closeLog func() error) {
	if cerr := closeLog(); cerr != nil && *err == nil {
		*err = cerr
	}
}

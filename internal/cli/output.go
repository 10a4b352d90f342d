package cli

import (
	"encoding/json"
	"fmt"
	"io"
)

// outputFormat is the value of --output; it implements pflag.Value so a bad
// value is rejected while flags are parsed, naming the flag.
type outputFormat string

const (
	outputTable outputFormat = "table"
	outputJSON  outputFormat = "json"
)

func (o *outputFormat) String() string { return string(*o) }

func (o *outputFormat) Set(s string) error {
	switch f := outputFormat(s); f {
	case outputTable, outputJSON:
		*o = f
		return nil
	}
	return fmt.Errorf("unsupported output format %q (want %s or %s)", s, outputTable, outputJSON)
}

func (o *outputFormat) Type() string { return "table|json" }

// writeJSONLine writes v as one line of compact JSON, the form for streams
// of objects that line-oriented tools (jq -c, grep) consume.
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return writeBytes(w, b)
}

// writeJSONDocument writes v as one indented JSON document, for output
// that is a single object people may also read.
func writeJSONDocument(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return writeBytes(w, b)
}

func writeBytes(w io.Writer, b []byte) error {
	b = append(b, '\n')
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// Package yamldoc holds YAML input checks shared by the strict decoders of
// user input (GpuConfig, simulate scenarios).
package yamldoc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// SingleDocument rejects YAML streams with more than one document: the
// YAML-to-JSON conversion reads only the first and would silently drop a
// second one, which is usually the config the user meant. Documents that
// hold nothing but comments do not count.
func SingleDocument(raw []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	docs := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return err
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue
		}
		docs++
		if docs > 1 {
			return fmt.Errorf("found %d or more YAML documents, want exactly one", docs)
		}
	}
}

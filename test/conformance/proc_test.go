//go:build e2e

package conformance_test

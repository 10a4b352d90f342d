//go:build !race

package allocate

// raceEnabled: see race_on_test.go.
const raceEnabled = false

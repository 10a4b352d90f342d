//go:build race

package allocate

// raceEnabled tells the tests that the race detector slows them down
// several times, so that the heaviest (the online optimum of a 16-GPU
// node, the relaxed bound of a 32-GPU one) leave their check to the run
// without it (Makefile: test-unit).
const raceEnabled = true

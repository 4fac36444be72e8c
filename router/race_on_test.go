//go:build race

package router

// raceDetector: built with -race, whose shadow memory and larger
// goroutine stacks make measured memory no build's that serves.
const raceDetector = true

//go:build !race

package router

// raceDetector: built with -race (race_on_test.go).
const raceDetector = false

package partitioner

// ParseGraph exposes the text graph form of the data-driven tests to the
// external test package (partitioner_test).
var ParseGraph = parseGraph

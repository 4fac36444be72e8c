package prismv1

// SameList says whether a and b name one list (ListVersion): both set,
// with process and gen equal. An unset version (a worker or router of
// an earlier release) names no list, not even another unset one.
func SameList(a, b *ListVersion) bool {
	return a.GetProcess() != 0 && a.GetProcess() == b.GetProcess() && a.GetGen() == b.GetGen()
}

package server

// DirectMaxRows and SetDirectMaxRows let the external tests run the
// hashing path on small tables (dedup.go).
func DirectMaxRows() int64 { return directMaxRows }

func SetDirectMaxRows(n int64) (restore func()) {
	old := directMaxRows
	directMaxRows = n
	return func() { directMaxRows = old }
}

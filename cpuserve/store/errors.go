package store

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Bad input. Lookup and Upsert wrap these with what was wrong (table,
// position, value); test with errors.Is. The store keeps serving after
// any of them: they are found before anything is read or written.
var (
	ErrUnknownModel   = errors.New("unknown model")
	ErrUnknownVersion = errors.New("unknown model version")
	ErrUnknownTable   = errors.New("unknown table")
	ErrIDOutOfRange   = errors.New("id out of range")
	ErrNegativeID     = errors.New("negative id")
	ErrBadOffsets     = errors.New("bag offsets not monotone")
	ErrDimMismatch    = errors.New("dim mismatch")
	// ErrBadRequest is any other bad input; such errors say what was
	// wrong without this sentinel's text (badRequestf).
	ErrBadRequest = errors.New("bad request")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("store closed")
	// ErrCorrupt means a row the catalog promises is missing or malformed,
	// or a block of the store's files is damaged (its checksum does not
	// match): the store, not the request, is at fault, and another
	// worker's copy may serve.
	ErrCorrupt = errors.New("store corrupt")
)

// IDError is a lookup's id outside its table (Err: ErrNegativeID or
// ErrIDOutOfRange; errors.Is sees through it): Index is the id's
// position in the ids the lookup was given, which a caller that looked
// up other ids than its request's (distinct ids, dedup) may set to the
// request's position before reporting it.
type IDError struct {
	Table string
	Index int
	ID    int64
	Rows  int64
	// Part, if set, is the rows of the table this store holds (a
	// row-wise shard's): the id's row, in the table, is another shard's.
	Part *RowPart
	Err  error
}

func (e *IDError) Error() string {
	if errors.Is(e.Err, ErrNegativeID) {
		return fmt.Sprintf("table %q: ids[%d]=%d: %v", e.Table, e.Index, e.ID, e.Err)
	}
	if e.Part != nil {
		return fmt.Sprintf("table %q: ids[%d]=%d, this store holds rows %s of the table's %d (not a partial lookup): %v", e.Table, e.Index, e.ID, e.Part, e.Rows, e.Err)
	}
	return fmt.Sprintf("table %q: ids[%d]=%d, table has %d rows: %v", e.Table, e.Index, e.ID, e.Rows, e.Err)
}

func (e *IDError) Unwrap() error { return e.Err }

// IsInputError says whether err is the caller's fault (a gRPC server maps
// it to InvalidArgument or NotFound) rather than the store's.
func IsInputError(err error) bool {
	for _, e := range []error{ErrUnknownModel, ErrUnknownVersion, ErrUnknownTable, ErrIDOutOfRange, ErrNegativeID, ErrBadOffsets, ErrDimMismatch, ErrBadRequest} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// badRequest is a bad input's message that is ErrBadRequest (errors.Is)
// without ending in its text: the caller reads what was wrong, not
// "...: bad request".
type badRequest struct{ err error }

func (e *badRequest) Error() string   { return e.err.Error() }
func (e *badRequest) Unwrap() []error { return []error{e.err, ErrBadRequest} }

// badRequestf formats a bad input's error (fmt.Errorf's verbs, %w
// included).
func badRequestf(format string, a ...any) error {
	return &badRequest{fmt.Errorf(format, a...)}
}

// corruptError is a read that found a damaged block in one of the
// store's files (Pebble's checksum): ErrCorrupt and Pebble's error both
// (errors.Is), with the file named and what to do.
type corruptError struct {
	path string
	err  error
}

func (e *corruptError) Error() string {
	// firstLine: Pebble joins a detail carrier on a line of its own.
	return fmt.Sprintf("store file %s is damaged (%s): the rows it holds cannot be read; replace the store with a copy of a serving worker's (prism store copy) or ingest the plan into a new --db", e.path, firstLine(e.err))
}

func (e *corruptError) Unwrap() []error { return []error{ErrCorrupt, e.err} }

// explainCorrupt returns err, naming the damaged file where it is
// Pebble's corruption error (a block whose checksum does not match, a
// truncated table file).
func explainCorrupt(err error) error {
	if err == nil || !pebble.IsCorruptionError(err) {
		return err
	}
	var ce *corruptError
	if errors.As(err, &ce) {
		return err
	}
	path := "(unnamed)"
	if info := pebble.ExtractDataCorruptionInfo(err); info != nil {
		path = info.Path
	}
	return &corruptError{path: path, err: err}
}

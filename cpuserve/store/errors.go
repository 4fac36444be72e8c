package store

import "errors"

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
	ErrBadRequest     = errors.New("bad request")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("store closed")
	// ErrCorrupt means a row the catalog promises is missing or malformed.
	ErrCorrupt = errors.New("store corrupt")
)

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

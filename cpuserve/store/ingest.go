package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
)

// stagingDir holds SSTs between their writing and their ingestion.
const stagingDir = "ingest-staging"

// IngestOptions configure Ingest.
type IngestOptions struct {
	// Model names the model; "" takes the plan's model name.
	Model string
	// DType is the stored dtype of every table ("" float32); TableDTypes
	// overrides it per table name.
	DType       DType
	TableDTypes map[string]DType
	// NoActivate leaves the new version inactive (Activate switches to it
	// later); a model's first version is always activated.
	NoActivate bool
	// HotBytes, if > 0, is recorded as the store's default hot tier size.
	HotBytes int64
	// SSTBytes is the target size of one ingested SST (default 64 MiB).
	SSTBytes int64
	// Progress, if set, is called with the bytes (float32 rows) done.
	Progress func(done, total int64)
	// Shard, if set, ingests only that shard of the plan's sharding
	// (plan.Sharding): its table-wise tables, and its rows of the
	// row-wise ones (keyed by their row id in the whole table). The
	// version records the shard (Store.Shard).
	Shard *int
}

// IngestReport says what Ingest did.
type IngestReport struct {
	Model     string
	Version   int
	Activated bool
	Tables    []TableReport
	// Rows and Bytes ingested now (shared and already ingested rows are
	// not counted); Bytes are float32 source bytes.
	Rows, Bytes int64
	Elapsed     time.Duration
	// Shard is the shard ingested (nil: the whole model).
	Shard *ShardRef
	// Existing: the model had a version of these very tables (every
	// one shared), which Version names; no version was added.
	Existing bool
}

// TableReport is one table of an ingest.
type TableReport struct {
	Name   string
	Phys   uint32
	Rows   int64
	Dim    int
	DType  DType
	Shared bool // an existing copy was reused
	// ResumedAt is the row an interrupted ingest went on from (0: fresh).
	ResumedAt int64
	Loss      *Loss
	// Part is the rows held of a row-wise sharded table (nil: all).
	Part *RowPart
}

type ingestJob struct {
	pt    plan.Table
	tf    *tablefile.Table
	phys  *physTable
	dtype DType
	rep   *TableReport
	part  *RowPart
}

// Ingest loads the tables of the plan in planDir and adds them as a new
// version of the model. Tables go in through SST ingestion in chunks of
// SSTBytes; the catalog records each chunk, so re-running an interrupted
// Ingest goes on where it stopped. A table is served only once all its
// rows are in, and the version only once all its tables are.
func (s *Store) Ingest(ctx context.Context, planDir string, o IngestOptions) (*IngestReport, error) {
	rep, err := s.ingest(ctx, planDir, o)
	if err != nil {
		return nil, s.closedErr(err)
	}
	// The new version's rows go to the hot tier now, not miss by miss.
	if err := s.Preload(ctx); err != nil {
		return nil, fmt.Errorf("ingest %q: %w", planDir, err)
	}
	return rep, nil
}

func (s *Store) ingest(ctx context.Context, planDir string, o IngestOptions) (*IngestReport, error) {
	start := time.Now()
	// Close cancels the ingest (ctx) and waits for it to stop.
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	s.ingestMu.Lock()
	defer s.ingestMu.Unlock()
	p, err := plan.Read(planDir)
	if err != nil {
		return nil, fmt.Errorf("ingest %q: %w", planDir, err)
	}
	model := o.Model
	if model == "" {
		model = p.Model.Name
	}
	if model == "" {
		model = filepath.Base(planDir)
	}
	if o.SSTBytes <= 0 {
		o.SSTBytes = 64 << 20
	}
	for name := range o.TableDTypes {
		// A mistyped name would leave its table at the default dtype
		// without a word.
		if !slices.ContainsFunc(p.Tables, func(t plan.Table) bool { return t.Name == name }) {
			return nil, badRequestf("ingest %q: a dtype is given for table %q, which the plan has not (its tables: %s)", planDir, name, tableNames(p.Tables))
		}
	}
	rep := &IngestReport{Model: model}
	tables, parts := p.Tables, make([]*RowPart, len(p.Tables))
	if o.Shard != nil {
		if tables, parts, err = shardTables(p, *o.Shard); err != nil {
			return nil, fmt.Errorf("ingest %q: %w", planDir, err)
		}
		rep.Shard = &ShardRef{Shard: *o.Shard, Shards: p.Sharding.Shards, Sharding: p.Sharding.Fingerprint()}
	}

	var jobs []*ingestJob
	defer func() {
		for _, j := range jobs {
			j.tf.Close()
		}
	}()
	for ti, pt := range tables {
		dt, err := o.tableDType(pt.Name)
		if err != nil {
			return nil, fmt.Errorf("ingest table %q: %w", pt.Name, err)
		}
		path, err := plan.Resolve(planDir, pt.File)
		if err != nil {
			return nil, fmt.Errorf("ingest table %q: %w", pt.Name, err)
		}
		tf, err := tablefile.Open(path)
		if err != nil {
			return nil, fmt.Errorf("ingest table %q: %w", pt.Name, err)
		}
		jobs = append(jobs, &ingestJob{pt: pt, tf: tf, dtype: dt, part: parts[ti]})
		if tf.Rows != pt.Rows || tf.Dim != pt.Dim || (pt.SHA256 != "" && tf.SHA256 != pt.SHA256) {
			return nil, fmt.Errorf("ingest table %q: file says %d x %d sha %s, plan says %d x %d sha %s: %w",
				pt.Name, tf.Rows, tf.Dim, tf.SHA256, pt.Rows, pt.Dim, pt.SHA256, ErrDimMismatch)
		}
		if tf.Rows >= 1<<40 {
			return nil, badRequestf("ingest table %q: %d rows is more than this store keys", pt.Name, tf.Rows)
		}
		switch pt.UnknownIDs {
		case "", plan.UnknownError, plan.UnknownHash, plan.UnknownZero:
		default:
			return nil, badRequestf("ingest table %q: unknown_ids %q", pt.Name, pt.UnknownIDs)
		}
	}

	// Claim a physical table for each job: a ready copy to share, an
	// interrupted ingest to resume, or a new id.
	s.catMu.Lock()
	next := s.cat.clone()
	if o.HotBytes > 0 {
		next.HotBytes = o.HotBytes
	}
	claimed := map[uint32]bool{}
	for _, j := range jobs {
		j.rep = &TableReport{Name: j.pt.Name, Rows: j.part.count(j.tf.Rows), Dim: j.tf.Dim, DType: j.dtype, Part: j.part}
		if t := next.findReady(j.tf.SHA256, j.dtype, j.part); t != nil {
			j.phys, j.rep.Shared = t, true
		} else if t := next.find(j.tf.SHA256, j.dtype, j.part, stateIngesting); t != nil && !claimed[t.ID] {
			j.phys, j.rep.ResumedAt = t, t.NextRow
		} else {
			j.phys = &physTable{ID: next.NextTable, SHA256: j.tf.SHA256, Rows: j.tf.Rows, Dim: j.tf.Dim, DType: j.dtype, State: stateIngesting, Source: j.tf.Path(), Part: j.part}
			next.NextTable++
			next.Tables[j.phys.ID] = j.phys
		}
		claimed[j.phys.ID] = true
		j.rep.Phys = j.phys.ID
	}
	// Interrupted ingests this plan does not continue are abandoned.
	var abandoned []uint32
	for id, t := range next.Tables {
		if t.State == stateIngesting && !claimed[id] {
			abandoned = append(abandoned, id)
			delete(next.Tables, id)
		}
	}
	err = s.commit(next)
	if err == nil {
		// Until the version names them (ingestMu: one ingest at a time).
		s.claimed = claimed
		defer func() {
			s.catMu.Lock()
			s.claimed = nil
			s.catMu.Unlock()
		}()
	}
	s.catMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("ingest %q: %w", planDir, err)
	}
	if err := s.deleteTables(ctx, abandoned); err != nil {
		return nil, fmt.Errorf("ingest %q: %w", planDir, err)
	}

	// Progress counts the bytes to write: a table shared with a ready
	// copy writes none (counted, it read as an ingest at 50 GiB/s).
	var total int64
	for _, j := range jobs {
		if !j.rep.Shared {
			total += j.part.count(j.tf.Rows) * int64(j.tf.Dim) * 4
		}
	}
	var done int64
	progress := func(n int64) {
		done += n
		if o.Progress != nil {
			o.Progress(done, total)
		}
	}
	for _, j := range jobs {
		if j.rep.Shared {
			continue
		}
		rows, err := s.ingestTable(ctx, j, o.SSTBytes, progress)
		if errors.Is(err, syscall.ENOSPC) {
			// Nothing else says where the disk went, nor how to get it back.
			return nil, fmt.Errorf("ingest table %q: %w (the rows ingested so far stay in the store, on its disk: the same ingest run again once the disk has room goes on where it stopped; an ingest of another plan drops them)", j.pt.Name, err)
		}
		if err != nil {
			return nil, fmt.Errorf("ingest table %q: %w", j.pt.Name, err)
		}
		rep.Rows += rows
		rep.Bytes += rows * int64(j.tf.Dim) * 4
	}

	// Every table is ready: the version can exist.
	s.catMu.Lock()
	next = s.cat.clone()
	m := next.Models[model]
	if m == nil {
		m = &modelEntry{Versions: map[int]*version{}}
		next.Models[model] = m
	}
	// The plan's folder as a path from anywhere: prism store versions
	// and a worker's refusal name it, run from another folder.
	from := planDir
	if abs, err := filepath.Abs(planDir); err == nil {
		from = abs
	}
	v := &version{N: m.latest() + 1, Plan: from, Created: now(), Tables: map[string]*versionTable{}, Shard: rep.Shard}
	for _, j := range jobs {
		v.Tables[j.pt.Name] = &versionTable{Phys: j.phys.ID, UnknownIDs: j.pt.UnknownIDs}
		if t := next.Tables[j.phys.ID]; t != nil {
			j.rep.Loss = t.Loss
		}
		rep.Tables = append(rep.Tables, *j.rep)
	}
	// A table this ingest shares must still hold its content: it may have
	// been updated (by its one model) or dropped since it was claimed.
	for _, j := range jobs {
		if t := next.Tables[j.phys.ID]; j.rep.Shared && (t == nil || t.Mutated || t.State != stateReady) {
			s.catMu.Unlock()
			return nil, fmt.Errorf("ingest %q: table %q: the copy it shares was updated or dropped during the ingest; run it again", planDir, j.pt.Name)
		}
	}
	// A version reading these very tables is this one already (the same
	// plan ingested again, or an ingest run again after a crash before
	// its switch): a copy of it would move the version Rollback returns
	// to onto the same rows.
	if n := m.same(v); n > 0 {
		v = m.Versions[n]
		rep.Existing = true
		err = nil // nothing to commit
	} else {
		m.Versions[v.N] = v
		err = s.commit(next)
	}
	rep.Version = v.N
	activate := !o.NoActivate || m.Active == 0
	rep.Activated = m.Active == v.N
	s.catMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("ingest %q: %w", planDir, err)
	}
	// The switch carries the model's updates into the new version (a
	// crash before it leaves the version ingested but inactive).
	if activate {
		if err := s.activate(model, v.N); err != nil {
			return nil, fmt.Errorf("ingest %q: %w", planDir, err)
		}
		rep.Activated = true
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// ingestTable writes the rows of j from its NextRow on as SSTs, ingests
// each and records the progress; then checks the content hash and marks
// the table ready. It returns the rows it ingested.
func (s *Store) ingestTable(ctx context.Context, j *ingestJob, sstBytes int64, progress func(int64)) (int64, error) {
	dim, dt := j.tf.Dim, j.dtype
	from := j.phys.NextRow
	loss := Loss{DType: dt}
	if j.phys.Loss != nil {
		loss = *j.phys.Loss
	}
	rowsPerSST := max(sstBytes/int64(dt.RowBytes(dim)+keyLen+8), 1)
	sink, err := s.newSSTSink(fmt.Sprintf("%06d", j.phys.ID))
	if err != nil {
		return 0, err
	}
	defer sink.discard()
	h := tablefile.NewHasher(dim)
	var (
		key      [keyLen]byte
		val      []byte
		dec      = make([]float32, dim)
		ingested int64
	)
	flush := func(nextRow int64) error {
		if sink.w == nil {
			return nil // nothing written since the last flush
		}
		inSST := sink.Rows
		if err := sink.flush(ctx); err != nil {
			return err
		}
		ingested += inSST
		return s.recordProgress(j.phys.ID, nextRow, &loss)
	}
	for b := range j.tf.NumBatches() {
		first, rows, err := j.tf.Batch(b)
		if err != nil {
			return ingested, err
		}
		h.Write(rows)
		n := int64(len(rows) / dim)
		if first+n <= from {
			continue
		}
		for r := max(from-first, 0); r < n; r++ {
			if !j.part.holds(first + r) {
				continue // another shard's row
			}
			if err := ctx.Err(); err != nil {
				return ingested, err
			}
			row := rows[r*int64(dim) : (r+1)*int64(dim)]
			if c := nonFinite(row); c >= 0 {
				// Served, it would make every score it pools into NaN;
				// measured for a smaller dtype, the loss record could
				// not be written (JSON has no NaN).
				return ingested, badRequestf("table %q row %d: value %v in column %d is not a finite number: an embedding row must be (fix the exported weights)", j.pt.Name, first+r, row[c], c)
			}
			val = dt.encode(val[:0], row)
			if dt != Float32 {
				dt.decode(dec, val)
				loss.add(row, dec, dim)
			}
			if err := sink.set(rowKey(key[:], j.phys.ID, first+r), val); err != nil {
				return ingested, err
			}
			if sink.Rows >= rowsPerSST {
				if err := flush(first + r + 1); err != nil {
					return ingested, err
				}
				progress(rowsPerSST * int64(dim) * 4)
			}
		}
	}
	rest := sink.Rows
	if err := flush(j.tf.Rows); err != nil {
		return ingested, err
	}
	progress(rest * int64(dim) * 4)
	if from > 0 {
		progress(j.part.count(from) * int64(dim) * 4)
	}
	if got := h.Sum(); got != j.tf.SHA256 {
		return ingested, fmt.Errorf("content hash %s, file says %s: %w", got, j.tf.SHA256, errors.New("corrupt table file"))
	}
	s.catMu.Lock()
	defer s.catMu.Unlock()
	next := s.cat.clone()
	t := next.Tables[j.phys.ID]
	if t == nil {
		return ingested, fmt.Errorf("table %d left the catalog during its ingest", j.phys.ID)
	}
	t.State, t.NextRow = stateReady, t.Rows
	if dt != Float32 {
		t.Loss = &loss
	}
	return ingested, s.commit(next)
}

func (s *Store) recordProgress(id uint32, nextRow int64, loss *Loss) error {
	s.catMu.Lock()
	defer s.catMu.Unlock()
	next := s.cat.clone()
	t := next.Tables[id]
	if t == nil {
		return fmt.Errorf("table %d left the catalog during its ingest", id)
	}
	t.NextRow = nextRow
	if loss.DType != Float32 {
		l := *loss
		t.Loss = &l
	}
	return s.commit(next)
}

// tableNames lists the tables' names for a message, the first ten and
// a count of the rest.
func tableNames(ts []plan.Table) string {
	var names []string
	for i, t := range ts {
		if i == 10 {
			names = append(names, fmt.Sprintf("and %d more", len(ts)-10))
			break
		}
		names = append(names, t.Name)
	}
	return strings.Join(names, ", ")
}

// nonFinite is the first column of row holding NaN or an infinity, -1
// when none does.
func nonFinite(row []float32) int {
	for i, x := range row {
		if x-x != 0 { // NaN and ±Inf; 0 for every finite x
			return i
		}
	}
	return -1
}

// tableDType is the stored dtype o asks for table name: its
// TableDTypes entry, else DType ("" float32).
func (o IngestOptions) tableDType(name string) (DType, error) {
	dt := o.DType
	if d, ok := o.TableDTypes[name]; ok {
		dt = d
	}
	return ParseDType(string(dt))
}

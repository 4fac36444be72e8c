package loadgen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/models"
)

// UpdateTable is one embedding table an update stream writes to: its
// name as in plan.json, its rows and its row width.
type UpdateTable struct {
	Name string
	Rows int64
	Dim  int
}

// UpdateOptions configure a stream of online embedding updates
// (Embeddings/Update), the load a trainer pushing fresh rows puts on a
// serving fleet beside its Recommend traffic.
type UpdateOptions struct {
	Model string
	// Tables are written in turn, one table an update.
	Tables []UpdateTable
	// Rows is the number of rows each update upserts (default 1).
	Rows int
	// ZipfS is the exponent of the ids' popularity in each table
	// (default 1.05): a trainer writes the rows its recent batches
	// touched, which are skewed like the lookups.
	ZipfS float64
	// Seed makes the stream reproducible: which ids are popular, which
	// are drawn and the rows' values.
	Seed uint64
}

// Updates builds update requests one after another, reproducibly for a
// seed. It is not safe for concurrent use; the runner owns one.
type Updates struct {
	o     UpdateOptions
	r     *rand.Rand
	zipfs []*models.Zipf
	// offs rotate each table's ranks onto its ids, so that the popular
	// rows are not the first ones of every table.
	offs []uint64
	n    int
}

// NewUpdates checks o and returns its update stream.
func NewUpdates(o UpdateOptions) (*Updates, error) {
	if o.Model == "" {
		return nil, errors.New("updates: no model")
	}
	if len(o.Tables) == 0 {
		return nil, errors.New("updates: no table to update")
	}
	if o.Rows == 0 {
		o.Rows = 1
	}
	if o.Rows < 0 {
		return nil, fmt.Errorf("updates: %d rows an update: want 1 or more", o.Rows)
	}
	if o.ZipfS == 0 {
		o.ZipfS = 1.05
	}
	u := &Updates{o: o, r: rand.New(rand.NewPCG(o.Seed, 0x75d)), zipfs: make([]*models.Zipf, len(o.Tables)), offs: make([]uint64, len(o.Tables))}
	for i, t := range o.Tables {
		if t.Name == "" {
			return nil, fmt.Errorf("updates: table %d has no name", i)
		}
		if t.Rows < 1 || t.Dim < 1 {
			return nil, fmt.Errorf("updates: table %q has %d rows of dim %d: want at least one row of dim 1 or more", t.Name, t.Rows, t.Dim)
		}
		z, err := models.NewZipf(u.r, o.ZipfS, t.Rows)
		if err != nil {
			return nil, fmt.Errorf("updates: table %q: %w", t.Name, err)
		}
		u.zipfs[i] = z
		u.offs[i] = u.r.Uint64N(uint64(t.Rows))
	}
	return u, nil
}

// scramble is a large prime: rank*scramble mod rows is a bijection of
// [0, rows) for every rows below it.
const scramble = 1<<61 - 1

// id maps a Zipf rank (1 = most popular) of table t onto a row id.
func (u *Updates) id(t int, rank int64) int64 {
	rows := uint64(u.o.Tables[t].Rows)
	hi, lo := bits.Mul64(uint64(rank-1), scramble)
	x := bits.Rem64(hi, lo, rows)
	return int64((x + u.offs[t]) % rows)
}

// Next builds the next update: the next table in turn, Rows ids drawn
// from its popularity (an id may repeat: the last of its rows wins),
// and rows of small values, as trained embeddings have.
func (u *Updates) Next() *prismv1.UpdateRequest {
	t := u.n % len(u.o.Tables)
	u.n++
	tab := u.o.Tables[t]
	req := &prismv1.UpdateRequest{Model: u.o.Model, Table: tab.Name, Ids: make([]int64, u.o.Rows), Rows: make([]byte, 4*u.o.Rows*tab.Dim)}
	for i := range req.Ids {
		req.Ids[i] = u.id(t, u.zipfs[t].Rank())
	}
	for i := 0; i < len(req.Rows); i += 4 {
		binary.LittleEndian.PutUint32(req.Rows[i:], math.Float32bits(float32(u.r.Float64()-0.5)/8))
	}
	return req
}

func (u *Updates) String() string {
	names := make([]string, len(u.o.Tables))
	for i, t := range u.o.Tables {
		names[i] = t.Name
	}
	if len(names) > 4 {
		return fmt.Sprintf("%d rows an update, %d tables in turn (%s ... %s)", u.o.Rows, len(names), strings.Join(names[:2], ","), names[len(names)-1])
	}
	return fmt.Sprintf("%d rows an update, tables %s in turn", u.o.Rows, strings.Join(names, ","))
}

// UpdateSender sends one update and waits for its acknowledgement. It is
// called from many goroutines at once.
type UpdateSender interface {
	Update(ctx context.Context, req *prismv1.UpdateRequest) error
}

// GRPCUpdater sends through an Embeddings client.
type GRPCUpdater struct {
	Client prismv1.EmbeddingsClient
}

var _ UpdateSender = GRPCUpdater{}

func (g GRPCUpdater) Update(ctx context.Context, req *prismv1.UpdateRequest) error {
	var tr metadata.MD
	_, err := g.Client.Update(ctx, req, grpc.Trailer(&tr))
	return withPushback(err, tr) // a retrying run reads the router's pushback
}

// updateSource sends embedding updates.
type updateSource struct {
	u *Updates
	s UpdateSender
}

func (s updateSource) next() (job, error) {
	req := s.u.Next()
	return job{upd: req, samples: len(req.Ids)}, nil
}

func (s updateSource) send(ctx context.Context, j job) error { return s.s.Update(ctx, j.upd) }

// UpdateRetryCodes are the refusals of an update a retry can cure, as a
// trainer retries them: the router's update queue full
// (ResourceExhausted, "back off"), its start-up window ("retry in N
// ms") and no live embedding worker of the model right now
// (Unavailable). The others are never retried, whatever Retry.Codes
// say: bad input (InvalidArgument), a model not served (NotFound) and
// routers naming each other (FailedPrecondition) answer the same update
// the same way again, and DeadlineExceeded ends the update's whole
// time, its retries' included.
var UpdateRetryCodes = []codes.Code{codes.ResourceExhausted, codes.Unavailable}

// updateRetry is r for updates: its codes (the defaults when none are
// given) less those UpdateRetryCodes leave out; nothing retried when
// none is left.
func updateRetry(r Retry) Retry {
	if r.Retries <= 0 {
		return r
	}
	cs := r.Codes
	if len(cs) == 0 {
		cs = RetryCodes
	}
	var kept []codes.Code
	for _, c := range cs {
		if slices.Contains(UpdateRetryCodes, c) && !slices.Contains(kept, c) {
			kept = append(kept, c)
		}
	}
	if len(kept) == 0 {
		return Retry{}
	}
	r.Codes = kept
	return r
}

// RunUpdates drives a run of updates, as Run does of Recommend requests:
// open loop at o.Profile (or closed loop with o.Clients), every latency
// from the update's intended send time, an update counted OK once
// acknowledged. The summary's samples are the rows written (Kind
// "updates"). o.Retry retries a refused update as it retries a
// Recommend request (backoff, the router's pushback, the deadline from
// the first attempt), the same update each time (an upsert: a retry of
// one applied after all writes the same rows), for the codes of
// UpdateRetryCodes alone.
func RunUpdates(ctx context.Context, o Options, u *Updates, s UpdateSender) (*Summary, error) {
	o.Kind = KindUpdates
	o.Retry = updateRetry(o.Retry)
	return run(ctx, o, updateSource{u, s}, nil)
}

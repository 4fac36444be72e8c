package loadgen

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/models"
)

// Candidates draws the number of candidates of each request.
type Candidates interface {
	Draw(r *rand.Rand) int
	String() string
}

// Fixed is the same count every request.
type Fixed int

func (f Fixed) Draw(*rand.Rand) int { return int(f) }
func (f Fixed) String() string      { return strconv.Itoa(int(f)) }

// Uniform draws uniformly from [Min, Max].
type Uniform struct{ Min, Max int }

func (u Uniform) Draw(r *rand.Rand) int { return u.Min + r.IntN(u.Max-u.Min+1) }
func (u Uniform) String() string        { return fmt.Sprintf("uniform:%d-%d", u.Min, u.Max) }

// DLRMv2 is MLPerf DLRMv2's query size: 100 to 700 user-item pairs, 270
// on average, skewed toward the small end. It is a discretised
// Kumaraswamy(2, b) density over [100, 700] with b chosen so the mean is
// 270, drawn by inverse CDF.
type DLRMv2 struct{ cdf []float64 }

const dlrmMin, dlrmMax, dlrmMean = 100, 700, 270.0

// NewDLRMv2 builds the distribution's table.
func NewDLRMv2() *DLRMv2 {
	pmf := func(b float64) []float64 {
		p := make([]float64, dlrmMax-dlrmMin+1)
		for i := range p {
			x := (float64(i) + 0.5) / float64(len(p))
			p[i] = 2 * b * x * math.Pow(1-x*x, b-1)
		}
		return p
	}
	mean := func(p []float64) float64 {
		s, w := 0.0, 0.0
		for i, v := range p {
			s += v * float64(dlrmMin+i)
			w += v
		}
		return s / w
	}
	lo, hi := 1.0, 100.0 // larger b, smaller mean
	for range 60 {
		mid := (lo + hi) / 2
		if mean(pmf(mid)) > dlrmMean {
			lo = mid
		} else {
			hi = mid
		}
	}
	p := pmf((lo + hi) / 2)
	cdf := make([]float64, len(p))
	acc := 0.0
	for i, v := range p {
		acc += v
		cdf[i] = acc
	}
	for i := range cdf {
		cdf[i] /= acc
	}
	return &DLRMv2{cdf: cdf}
}

func (d *DLRMv2) Draw(r *rand.Rand) int {
	return dlrmMin + sort.SearchFloat64s(d.cdf, r.Float64())
}
func (d *DLRMv2) String() string { return "dlrmv2" }

// ParseCandidates reads "270", "uniform:100-700" or "dlrmv2".
func ParseCandidates(s string) (Candidates, error) {
	switch {
	case s == "dlrmv2" || s == "mlperf":
		return NewDLRMv2(), nil
	case strings.HasPrefix(s, "uniform:"):
		lo, hi, ok := strings.Cut(strings.TrimPrefix(s, "uniform:"), "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil || a < 1 || b < a {
			return nil, fmt.Errorf("candidates %q: want uniform:MIN-MAX with 1 <= MIN <= MAX", s)
		}
		return Uniform{a, b}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("candidates %q: want a positive count, uniform:MIN-MAX or dlrmv2", s)
	}
	return Fixed(n), nil
}

// RequestOptions shape the requests of a run.
type RequestOptions struct {
	// Model and Version go into every request.
	Model   string
	Version int64
	// Sig is the model's inputs.
	Sig models.Signature
	// Context names the inputs sent once per request; the others are
	// sent per candidate.
	Context []string
	// ExpandContext sends the Context inputs per candidate instead, every
	// candidate repeating the request's one context sample: the same
	// requests as with Context, without the user context (the baseline
	// it is measured against).
	ExpandContext bool
	// Candidates per request (default dlrmv2).
	Candidates Candidates
	// Seed makes the request stream reproducible.
	Seed uint64
	// ZipfS is the exponent of the per-table id popularity (default 1.05).
	ZipfS float64
	// Stream picks the sequence of synthetic requests among those of
	// Seed's id popularity (models.SyntheticOptions.Stream; 0: Seed's
	// one sequence). Two runs against one store want different streams:
	// a run that replays another's requests finds their rows cached.
	Stream uint64
	// Criteo, if set, replays rows of a Criteo-format file instead of
	// drawing synthetic ones; the rows are read once and cycled.
	Criteo io.Reader
	// CriteoName names the Criteo file in messages.
	CriteoName string
	// Pool, if positive, builds this many requests before the run and
	// cycles through them (each send gets its own request id), as MLPerf's
	// LoadGen loads its samples before timing: drawing hundreds of Zipf
	// ids per request then costs the generator nothing during the run,
	// so it takes less of a machine it shares with the servers. Each
	// pooled request is marshaled then too, and a PremarshaledSender
	// sends those bytes with only the request id appended.
	Pool int
	// PoolJSON encodes the pool's requests in protojson instead, for an
	// HTTPSender (HTTP/JSON): protojson writes a request of 270
	// candidates in about 1.8 ms, which at every send would make the
	// generator's own CPU the bound of a run on a shared machine.
	PoolJSON bool
	// IDPrefix starts every request id (default "lg-"); the sequence
	// number follows.
	IDPrefix string
}

// Requests builds requests one after another, reproducibly for a seed.
// It is not safe for concurrent use; the runner owns one.
type Requests struct {
	o    RequestOptions
	r    *rand.Rand
	src  models.Source
	rows *models.Batch // Criteo rows, replayed cyclically
	next int
	ctx  []bool // per input: in the context
	seq  uint64
	pool []*prismv1.RecommendRequest
	wire [][]byte // pool[i] marshaled without its request id (PoolJSON: in protojson, open)
	// A mix of models (NewMixedRequests): each request is the next of
	// the stream of the model choose draws; the fields above are unused.
	mix    []*Requests
	shares []ModelShare
	choose *Chooser
}

// NewRequests checks o and returns its request stream.
func NewRequests(o RequestOptions) (*Requests, error) {
	if len(o.Sig.Inputs) == 0 {
		return nil, errors.New("requests: the model has no inputs")
	}
	if o.Candidates == nil {
		o.Candidates = NewDLRMv2()
	}
	if o.IDPrefix == "" {
		o.IDPrefix = "lg-"
	}
	q := &Requests{o: o, r: rand.New(rand.NewPCG(o.Seed, 0xc4d)), ctx: make([]bool, len(o.Sig.Inputs))}
	for _, name := range o.Context {
		found := false
		for i, in := range o.Sig.Inputs {
			if in.Name == name {
				q.ctx[i], found = true, true
				if in.Offsets != "" || in.Kind == models.OffsetsKind {
					// An EmbeddingBag's ids, weights or offsets: one bag
					// per candidate, drawn 1 to Width long.
					return nil, fmt.Errorf("requests: input %q is jagged (an EmbeddingBag's ids, weights or offsets): it comes in the candidates, not the context", name)
				}
			}
		}
		if !found {
			names := make([]string, len(o.Sig.Inputs))
			for i, in := range o.Sig.Inputs {
				names[i] = in.Name
			}
			return nil, fmt.Errorf("requests: context input %q (--context-inputs) is not an input of the model; its inputs: %s", name, strings.Join(names, ","))
		}
	}
	if o.Criteo != nil {
		c, err := models.NewCriteo(o.Criteo, o.CriteoName, o.Sig)
		if err != nil {
			return nil, err
		}
		rows, err := c.Next(1 << 20)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if rows == nil || rows.N == 0 {
			return nil, fmt.Errorf("requests: criteo %s has no rows", o.CriteoName)
		}
		q.rows = rows
		return q, nil
	}
	s, err := models.NewSynthetic(o.Sig, models.SyntheticOptions{Seed: o.Seed, ZipfS: o.ZipfS, Stream: o.Stream})
	if err != nil {
		return nil, fmt.Errorf("requests: %w", err)
	}
	q.src = s
	return q, nil
}

// draw returns n samples: synthetic, or the next n Criteo rows.
func (q *Requests) draw(n int) (*models.Batch, error) {
	if q.src != nil {
		return q.src.Next(n)
	}
	if q.next+n <= q.rows.N {
		b := q.rows.Slice(q.next, q.next+n)
		q.next = (q.next + n) % q.rows.N
		return b, nil
	}
	// Wrap around: copy the rows into a fresh batch.
	out := &models.Batch{N: n, Sig: q.rows.Sig, Columns: make([]models.Column, len(q.rows.Columns))}
	for range n {
		row := q.rows.Slice(q.next, q.next+1)
		for c := range out.Columns {
			out.Columns[c].F32 = append(out.Columns[c].F32, row.Columns[c].F32...)
			out.Columns[c].I64 = append(out.Columns[c].I64, row.Columns[c].I64...)
		}
		q.next = (q.next + 1) % q.rows.N
	}
	return out, nil
}

// Next builds the next request.
func (q *Requests) Next() (*prismv1.RecommendRequest, error) {
	req, _, err := q.nextSend()
	return req, err
}

// nextSend builds the next request and, for a pooled one, its wire form.
func (q *Requests) nextSend() (*prismv1.RecommendRequest, *Premarshaled, error) {
	_, req, wire, err := q.nextModel()
	return req, wire, err
}

// nextModel is nextSend and the index of the request's model in a mix
// (0 for one model).
func (q *Requests) nextModel() (int, *prismv1.RecommendRequest, *Premarshaled, error) {
	if q.mix != nil {
		i := q.choose.Next()
		req, wire, err := q.mix[i].nextSend()
		return i, req, wire, err
	}
	req, wire, err := q.nextOne()
	return 0, req, wire, err
}

// nextOne is nextSend of one model's stream.
func (q *Requests) nextOne() (*prismv1.RecommendRequest, *Premarshaled, error) {
	if q.o.Pool <= 0 {
		req, err := q.build()
		return req, nil, err
	}
	if q.pool == nil {
		if err := q.fill(); err != nil {
			return nil, nil, err
		}
	}
	i := q.seq % uint64(len(q.pool))
	p := q.pool[i]
	q.seq++
	// A new envelope per send: the pooled features are shared, read
	// only, by concurrent sends.
	req := &prismv1.RecommendRequest{
		Model: p.Model, Version: p.Version, NumCandidates: p.NumCandidates,
		Context: p.Context, Candidates: p.Candidates,
		RequestId: q.o.IDPrefix + strconv.FormatUint(q.seq, 10),
	}
	if q.wire[i] == nil {
		return req, nil, nil
	}
	if q.o.PoolJSON {
		// nil (encoded whole at the send) for an id protojson escapes.
		return req, newPremarshaledJSON(req, q.wire[i]), nil
	}
	return req, newPremarshaled(req, q.wire[i]), nil
}

// fill builds the pool, and marshals each entry once (in protojson for
// PoolJSON), without its request id, so sends need not marshal it again
// (see Premarshaled).
func (q *Requests) fill() error {
	pool := make([]*prismv1.RecommendRequest, 0, q.o.Pool)
	wire := make([][]byte, 0, q.o.Pool)
	for range q.o.Pool {
		req, err := q.build()
		if err != nil {
			return err
		}
		req.RequestId = "" // each send sets its own
		// An entry that does not marshal (a model name that is not UTF-8)
		// is left to fail at each send, as it does unpooled.
		var b []byte
		if q.o.PoolJSON {
			b, err = marshalJSONOpen(req)
		} else {
			b, err = proto.Marshal(req)
		}
		if err != nil {
			b = nil
		}
		pool, wire = append(pool, req), append(wire, b)
	}
	q.pool, q.wire = pool, wire
	return nil
}

// Prepare builds the pool now (before timing), if there is one.
func (q *Requests) Prepare() error {
	for _, m := range q.mix {
		if err := m.Prepare(); err != nil {
			return fmt.Errorf("model %s: %w", m.o.Model, err)
		}
	}
	if q.o.Pool <= 0 || q.pool != nil {
		return nil
	}
	seq := q.seq
	if err := q.fill(); err != nil {
		return err
	}
	q.seq = seq
	return nil
}

// build draws one request.
func (q *Requests) build() (*prismv1.RecommendRequest, error) {
	n := q.o.Candidates.Draw(q.r)
	q.seq++
	req := &prismv1.RecommendRequest{
		Model: q.o.Model, Version: q.o.Version, NumCandidates: int32(n),
		RequestId:  q.o.IDPrefix + strconv.FormatUint(q.seq, 10),
		Candidates: &prismv1.Features{},
	}
	cand, err := q.draw(n)
	if err != nil {
		return nil, fmt.Errorf("requests: %w", err)
	}
	var ctxb *models.Batch
	for i, in := range q.o.Sig.Inputs {
		b, feats := cand, req.Candidates
		if q.ctx[i] {
			if ctxb == nil {
				if ctxb, err = q.draw(1); err != nil {
					return nil, fmt.Errorf("requests: %w", err)
				}
				req.Context = &prismv1.Features{}
			}
			b, feats = ctxb, req.Context
		}
		col := b.Columns[i]
		if q.ctx[i] && q.o.ExpandContext {
			// The context sample, repeated for every candidate.
			col = models.Column{F32: repeat(col.F32, n), I64: repeat(col.I64, n)}
			feats = req.Candidates
		}
		pi := &prismv1.Input{Name: in.Name}
		if in.Kind == models.DenseKind {
			pi.Values = col.F32
		} else {
			pi.Ids = col.I64
		}
		feats.Inputs = append(feats.Inputs, pi)
	}
	if q.o.ExpandContext {
		req.Context = nil
	}
	return req, nil
}

// repeat is one sample's values n times (nil stays nil).
func repeat[T any](one []T, n int) []T {
	if one == nil {
		return nil
	}
	out := make([]T, 0, len(one)*n)
	for range n {
		out = append(out, one...)
	}
	return out
}

package router

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-serve/prism/api/prismv1"
)

// A router that follows another for embedding updates (follow.go) asks
// it, each heartbeat, how it judges each model's workers
// (Registry.List's updates, filled here): the update acknowledged last,
// the one numbered last, the workers it leaves out whatever they hold
// (foreign, diverged) and whether the model's start-up window is open.
// The sequencer decides; followers apply its decisions to the
// announcements they hear themselves.

// describe is the sequencer's view of its models' updates at now; nil
// once it resigned (another router sequences).
func (s *sequencer) describe(now time.Time) map[string]*prismv1.ModelUpdates {
	if s.resigned {
		return nil
	}
	out := map[string]*prismv1.ModelUpdates{}
	for name, m := range s.models {
		updated := m.next > 0 || m.committed > 0
		for _, k := range m.known {
			updated = updated || k > 0
		}
		left := slices.Collect(maps.Keys(m.foreign))
		for id := range m.diverged {
			if !slices.Contains(left, id) {
				left = append(left, id)
			}
		}
		for id, w := range s.workers {
			// Of another layout than the sequence's (compatible).
			if slices.Contains(w.GetModels(), m.name) && keyOf(w, m.name) == name && !s.compatible(m.name, w) && !slices.Contains(left, id) {
				left = append(left, id)
			}
		}
		if !updated && len(left) == 0 {
			continue // nothing a follower would judge otherwise
		}
		slices.Sort(left)
		var inSync []string
		for id, w := range s.workers {
			if slices.Contains(w.GetModels(), m.name) && keyOf(w, m.name) == name && s.inSync(w, m.name, now) {
				inSync = append(inSync, id)
			}
		}
		slices.Sort(inSync)
		out[name] = &prismv1.ModelUpdates{
			Acknowledged: m.committed, Numbered: m.next, LeftOut: left,
			Settling: now.Before(s.settles(m)), InSync: inSync, Stranded: s.stranded(m),
		}
	}
	return out
}

// stranded is the live workers of sequence m behind by updates its log
// no longer holds, sorted: out until their store is replaced by a copy
// of a serving worker's. The heartbeat finds them (modelSeq.stale: it
// logs each and replays them nothing); read from that set, not the
// known map, since every step publishes the count (a walk of every
// worker there cost 75-83 us a step with 1,000 workers: BENCHMARKS.md).
func (s *sequencer) stranded(m *modelSeq) []string {
	var ids []string
	for id := range m.stale {
		if _, diverged := m.diverged[id]; !diverged && s.workers[id] != nil && m.known[id] < m.floor {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// describe is the driver's: the sequencer's view now.
func (d *updateDriver) describe() map[string]*prismv1.ModelUpdates {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq.describe(d.now())
}

// sequencing is the update driver of this router while it sequences
// (nil while it follows).
func (r *Router) sequencing() *updateDriver {
	switch {
	case r.el != nil:
		return r.el.term.Load().d
	case r.fol == nil:
		return r.upd
	}
	return nil
}

// sequencerAddr is the address of the router that sequences embedding
// updates when it is not this one, as this one knows it: the elected
// holder, or the one Options.Sequencer names ("": this one, or not
// known).
func (r *Router) sequencerAddr() string {
	switch {
	case r.el != nil:
		if l := r.el.leader(); l != r.el.self {
			return l
		}
	case r.fol != nil:
		return r.opts.Sequencer
	}
	return ""
}

var updateLogBytesDesc = prometheus.NewDesc("prism_router_update_log_bytes", "Bytes of memory the recent updates the sequencing router keeps in its update log hold, by sequence (a model, or a shard of one: MODEL#shardK), against --update-log-bytes each and --update-log-total-bytes together.", []string{"model"}, nil)

// updateLogCollector reports the update log's bytes by sequence at each
// scrape, while this router sequences.
type updateLogCollector struct{ r *Router }

// divergedDesc: the live embedding workers each sequence holds out of
// serving for a diverged copy. They never come back under their id (the
// operator's mend is a new worker on a copy of an up-to-date store), so
// unlike embedding_workers_behind this does not pass by itself.
// strandedDesc: the live embedding workers each sequence cannot catch
// up (behind by updates its log no longer holds); like diverged ones
// they come back only on a copy of a serving worker's store, which a
// worker serving with --mend makes by itself.
var strandedDesc = prometheus.NewDesc("prism_router_embedding_workers_stranded", "Live embedding workers of a model (a sequence: a model, or a shard of one, MODEL#shardK) behind by updates the sequencing router's log no longer holds (or that were behind when a router keeping its log in memory restarted): no replay catches them up; they serve again once their store is replaced with a copy of a serving worker's (by themselves with --mend, the default; else prism store copy). Counted in prism_router_embedding_workers_behind too.", []string{"model"}, nil)

// behindDesc: the embedding workers each sequence leaves out for lacking
// acknowledged updates, while this router sequences.
var behindDesc = prometheus.NewDesc("prism_router_embedding_workers_behind", "Embedding workers left out of serving a model (a sequence: a model, or a shard of one, MODEL#shardK) because they lack acknowledged updates; reported by the router sequencing updates only.", []string{"model"}, nil)

var divergedDesc = prometheus.NewDesc("prism_router_embedding_workers_diverged", "Live embedding workers the sequencing router holds out of serving a model (a sequence: a model, or a shard of one, MODEL#shardK) because their copy diverged from their peers' (they answered an update otherwise than the others did); they take no lookups and no updates until replaced with a copy of an up-to-date worker's store (by themselves with --mend, the default; else prism store copy).", []string{"model"}, nil)

func (updateLogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- updateLogBytesDesc
	ch <- divergedDesc
	ch <- strandedDesc
	ch <- behindDesc
}

func (c updateLogCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.r.sequencing()
	if d == nil {
		return
	}
	// As of the driver's last step, read without its lock
	// (publishLogBytes): a flood of updates holds it most of the time.
	for _, g := range []struct {
		desc *prometheus.Desc
		p    *atomic.Pointer[map[string]int64]
	}{{updateLogBytesDesc, &d.logBytes}, {divergedDesc, &d.divergedN}, {strandedDesc, &d.strandedN}, {behindDesc, &d.behindN}} {
		p := g.p.Load()
		if p == nil {
			continue
		}
		for key, n := range *p {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n), key)
		}
	}
}

// describeUpdates fills Registry.List's updates: this router's
// sequencer's view, and whether it sequences now (a router that follows
// answers nil, false).
func (r *Router) describeUpdates() (map[string]*prismv1.ModelUpdates, bool) {
	d := r.sequencing()
	if d == nil {
		return nil, false
	}
	u := d.describe()
	return u, u != nil // nil once it resigned
}

// pollSequencer fetches the sequencer's view for the follower (one
// heartbeat's call; a failure keeps the last view).
func (r *Router) pollSequencer(ctx context.Context) {
	f, addr := r.fol, r.opts.Sequencer
	if r.el != nil {
		f, addr = r.el.fol, r.el.leader()
		if addr == r.el.self {
			return // this router leads
		}
	}
	if f == nil || addr == "" {
		return
	}
	if err := f.poll(ctx, addr, r.opts.Heartbeat); err != nil && f.noteFailure() {
		r.log.Warn("cannot ask the update sequencer which embedding workers hold the acknowledged updates; judging by the last answer and the workers' own announcements", "sequencer", addr, "err", err)
	}
}

// copySequencerLog brings this router's copy of the elected sequencer's
// update log up to date (replica.go): a heartbeat's pull, beside the
// poll of its view, so a long copy does not hold the view back.
func (r *Router) copySequencerLog(ctx context.Context) {
	if r.el == nil {
		return // a named sequencer is never taken over: no copy of its log
	}
	addr := r.el.leader()
	if addr == "" || addr == r.el.self {
		return
	}
	conn, err := r.sequencerConn(addr)
	if err == nil {
		// Up to 16 pages (256 MiB) a heartbeat; the rest at the next.
		err = r.el.copy.pull(ctx, conn, r.opts.DefaultTimeout, 16)
	}
	if err != nil && r.el.copy.failed() {
		r.log.Warn("cannot copy the update sequencer's log; if this router is elected next it catches up lagging embedding workers only from what it copied", "sequencer", addr, "err", err)
	} else if err == nil {
		r.el.copy.pulled()
	}
}

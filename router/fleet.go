package router

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/prism-serve/prism/api/prismv1"
)

// FleetRow is one worker's state for one of its models as a router's
// registry reports it (Registry.List; prism status prints these).
type FleetRow struct {
	Model string
	// Shard is "K/N" for a worker holding one shard of the model's
	// embedding tables, "" for the whole model.
	Shard string
	// Sharding is the fingerprint of the sharding plan the worker's
	// shard comes from (ShardRef.sharding; "": the whole model, or a
	// worker of a release that does not say): two shardings of one count
	// place tables otherwise.
	Sharding string
	Role     string
	Addr     string
	ID       string
	// State is what the router does with the worker for this model:
	// serving; behind (lacks acknowledged updates: caught up, then
	// serves); stranded (behind by updates the router's log no longer
	// holds: out until its store is replaced); diverged (its copy
	// differs from its peers': out for good, replace its store); left out (claims updates the sequencer
	// never numbered); settling (the router's start-up window: no
	// lookups yet); unhealthy (it says so); or unknown (the router does
	// not sequence updates and did not say).
	State string
	// Holds and Acknowledged are the model's (or shard's) updates the
	// worker holds and the router acknowledged last; -1 when not known
	// (a dense worker, or a model with no update).
	Holds, Acknowledged int64
	Outstanding         int64
	// Mends: an embedding worker replacing its own store with a serving
	// worker's copy when it is out for good (WorkerInfo.mends).
	Mends bool
}

// ShardLabel is FleetRow.Shard of shard k of n: "k/n".
func ShardLabel(k, n int) string { return fmt.Sprintf("%d/%d", k, n) }

// Fleet is resp's workers, one row for each worker and model it
// serves, ordered by model, role (embedding first), shard and address.
// Only a router that sequences updates (resp.not_sequencing unset and
// resp.updates filled) says which embedding workers are in sync; of a
// model whose updates it has no view of, an embedding worker is
// serving while healthy, as for a model never updated.
func Fleet(resp *prismv1.ListResponse) []FleetRow {
	var rows []FleetRow
	for _, w := range resp.GetWorkers() {
		role := strings.ToLower(strings.TrimPrefix(w.GetRole().String(), "ROLE_"))
		for _, model := range w.GetModels() {
			r := FleetRow{Model: model, Role: role, Addr: w.GetAddr(), ID: w.GetId(), Holds: -1, Acknowledged: -1, Outstanding: w.GetOutstanding(), Mends: w.GetMends()}
			if ref := w.GetShards()[model]; ref.GetShards() > 0 {
				r.Shard = ShardLabel(int(ref.GetShard()), int(ref.GetShards()))
				r.Sharding = ref.GetSharding()
			}
			r.State = fleetState(resp, w, model, &r)
			rows = append(rows, r)
		}
	}
	roleOrder := map[string]int{"embedding": 0, "dense": 1}
	slices.SortStableFunc(rows, func(a, b FleetRow) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		if c := roleOrder[a.Role] - roleOrder[b.Role]; c != 0 {
			return c
		}
		if c := strings.Compare(a.Shard, b.Shard); c != 0 {
			return c
		}
		if c := strings.Compare(a.Addr, b.Addr); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return rows
}

// fleetState is w's state for model (and fills r's update numbers).
func fleetState(resp *prismv1.ListResponse, w *prismv1.WorkerInfo, model string, r *FleetRow) string {
	if !w.GetHealthy() {
		return "unhealthy"
	}
	if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
		return "serving"
	}
	if h, ok := w.GetUpdateSeq()[model]; ok {
		r.Holds = h
	}
	u := resp.GetUpdates()[keyOf(w, model)]
	if u != nil {
		r.Acknowledged = u.GetAcknowledged()
	}
	if seq, ok := w.GetDiverged()[model]; ok {
		// Its store's mark: out whatever the router's view.
		return fmt.Sprintf("diverged at %d", seq)
	}
	if u == nil {
		if resp.GetNotSequencing() {
			return "unknown"
		}
		return "serving" // no update of the model (or shard) yet
	}
	switch id := w.GetId(); {
	case u.GetSettling():
		return "settling"
	case slices.Contains(u.GetInSync(), id):
		return "serving"
	case slices.Contains(u.GetLeftOut(), id):
		if r.Holds > u.GetNumbered() {
			return "left out" // claims updates never numbered
		}
		return "diverged" // found by the router, its store not told yet
	case slices.Contains(u.GetStranded(), id):
		return "stranded"
	default:
		return "behind"
	}
}

// WriteFleet prints resp as a table of Fleet's rows, then a line for
// each model (or shard of one) no worker serves in a role, and says
// when the router does not sequence updates (its view of them is
// another router's).
func WriteFleet(out io.Writer, resp *prismv1.ListResponse) error {
	rows := Fleet(resp)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tSHARD\tROLE\tADDRESS\tSTATE\tUPDATES\tOUTSTANDING\tWORKER")
	for _, r := range rows {
		shard, updates := r.Shard, "-"
		if shard == "" {
			shard = "-"
		}
		switch {
		case r.Holds >= 0 && r.Acknowledged >= 0:
			updates = fmt.Sprintf("%d of %d", r.Holds, r.Acknowledged)
		case r.Holds >= 0:
			updates = fmt.Sprint(r.Holds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Model, shard, r.Role, r.Addr, r.State, updates, r.Outstanding, r.ID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintln(out, "no workers registered")
	}
	for _, line := range fleetGaps(rows) {
		fmt.Fprintln(out, line)
	}
	for _, line := range fleetMends(rows, resp.GetNotSequencing(), resp.GetSequencer()) {
		fmt.Fprintln(out, line)
	}
	switch {
	case resp.GetNotSequencing() && resp.GetSequencer() != "":
		fmt.Fprintf(out, "this router does not sequence embedding updates: %s does, and says which embedding workers are in sync: prism status --router %s\n", resp.GetSequencer(), resp.GetSequencer())
	case resp.GetNotSequencing():
		fmt.Fprintln(out, "this router does not sequence embedding updates now, and does not know which router does (an election under way?): ask the one that does which embedding workers are in sync")
	}
	return nil
}

// FleetProblems are what in resp needs an operator (prism status
// --check): each model, or shard of one, no worker serves in a role
// (its requests fail), and each worker out of a model for good
// (diverged, left out claiming updates never numbered, or stranded
// behind the router's log). Workers behind or settling are not
// problems: they serve once caught up.
func FleetProblems(resp *prismv1.ListResponse) []string {
	rows := Fleet(resp)
	out := fleetGaps(rows)
	for _, r := range rows {
		if outForGood(r.State) {
			out = append(out, fmt.Sprintf("%s: %s worker %s (%s) is %s", r.Model, r.Role, r.Addr, r.ID, r.State))
		}
	}
	return out
}

// fleetMends says, for each embedding worker out of a model for good
// (diverged, left out, stranded), how to mend it: its store replaced by
// a copy of the first worker CopySources names for the models (and shards) it
// holds, whose address it names, or that none does yet. A router that
// does not sequence updates knows no worker in sync: the line names
// the one that does (sequencer), to ask.
func fleetMends(rows []FleetRow, notSequencing bool, sequencer string) []string {
	workers, addr, ids := embeddingHolds(rows)
	mends := map[string]bool{}
	for _, r := range rows {
		mends[r.ID] = mends[r.ID] || r.Mends
	}
	var out []string
	for _, id := range ids {
		var why string
		selfMends := mends[id] // it mends itself only when told: diverged, stranded
		for _, m := range slices.Sorted(maps.Keys(workers[id])) {
			if st := workers[id][m].state; outForGood(st) {
				if why == "" {
					why = fmt.Sprintf("%s: %s", m, st)
				}
				selfMends = selfMends && st != "left out"
			}
		}
		if why == "" {
			continue
		}
		if notSequencing {
			ask := "the router sequencing updates (not known now: an election under way?)"
			if sequencer != "" {
				ask = "prism status --router " + sequencer
			}
			out = append(out, fmt.Sprintf("embedding worker %s (%s) is out for good; %s names a worker to copy its store from (prism store copy)", addr[id], why, ask))
			continue
		}
		need := map[string]ShardNeed{}
		for m, h := range workers[id] {
			need[m] = ShardNeed{h.shard, h.sharding}
		}
		from := ""
		if srcs := CopySources(rows, need, id); len(srcs) > 0 {
			from = srcs[0]
		}
		switch {
		case from == "":
			out = append(out, fmt.Sprintf("embedding worker %s (%s) is out for good; no worker serves all of its models (and shards) in sync to copy a store from yet", addr[id], why))
		case selfMends:
			out = append(out, fmt.Sprintf("embedding worker %s (%s) is out for good until it mends itself (--mend): it copies a serving worker's store (%s) and restarts; its log's \"mend:\" lines say how far, or why not", addr[id], why, from))
		default:
			out = append(out, fmt.Sprintf("embedding worker %s (%s) is out for good; mend it on its host: prism store copy --from %s --db ITS_STORE, then restart it", addr[id], why, from))
		}
	}
	return out
}

// held is an embedding worker's row of a model: its shard, the
// sharding's fingerprint and its state.
type held struct{ shard, sharding, state string }

// embeddingHolds indexes rows' embedding workers: id -> model -> held,
// id -> address, and the ids by address.
func embeddingHolds(rows []FleetRow) (map[string]map[string]held, map[string]string, []string) {
	workers := map[string]map[string]held{}
	addr := map[string]string{}
	for _, r := range rows {
		if r.Role != "embedding" {
			continue
		}
		if workers[r.ID] == nil {
			workers[r.ID] = map[string]held{}
		}
		workers[r.ID][r.Model] = held{r.Shard, r.Sharding, r.State}
		addr[r.ID] = r.Addr
	}
	ids := slices.SortedFunc(maps.Keys(workers), func(a, b string) int {
		return cmp.Or(strings.Compare(addr[a], addr[b]), strings.Compare(a, b))
	})
	return workers, addr, ids
}

// ShardNeed is what a store copy must hold of a model: Shard, Fleet's
// "K/N" ("" the whole model), of the sharding whose fingerprint is
// Sharding ("": of any, as when not known).
type ShardNeed struct{ Shard, Sharding string }

// CopySources are the addresses of the embedding workers (by address,
// but exclude, an id) to copy a store from for a worker holding need
// (model -> its shard): each serving every one of those in sync (a
// sharded model's same shard of the same sharding, where both name
// theirs), and out of no model itself (prism store copy refuses a store
// marking a model diverged).
func CopySources(rows []FleetRow, need map[string]ShardNeed, exclude string) []string {
	workers, addr, ids := embeddingHolds(rows)
	var out []string
	for _, src := range ids {
		if src == exclude {
			continue
		}
		ok := true
		for m, shard := range need {
			if h, has := workers[src][m]; !has || h.state != "serving" || h.shard != shard.Shard || shard.Sharding != "" && h.sharding != "" && h.sharding != shard.Sharding {
				ok = false
				break
			}
		}
		for _, h := range workers[src] {
			if outForGood(h.state) {
				ok = false // out of a model itself: no copy to take
			}
		}
		if ok {
			out = append(out, addr[src])
		}
	}
	return out
}

// outForGood says whether a worker in state st is out of a model until
// its store is replaced: diverged, left out (claiming updates never
// numbered) or stranded (behind the router's log).
func outForGood(st string) bool {
	return strings.HasPrefix(st, "diverged") || st == "left out" || st == "stranded"
}

// fleetGaps says, for each model of rows, which role no worker serves
// (Recommend for it fails Unavailable), and of a sharded model which
// shard no embedding worker serves.
func fleetGaps(rows []FleetRow) []string {
	type model struct {
		serving map[string]int // role -> workers serving
		shards  int            // a sharded model's shard count, 0: whole
		shard   map[string]int // "K/N" -> embedding workers serving
	}
	models := map[string]*model{}
	for _, r := range rows {
		m := models[r.Model]
		if m == nil {
			m = &model{serving: map[string]int{}, shard: map[string]int{}}
			models[r.Model] = m
		}
		ok := 0
		if r.State == "serving" {
			ok = 1
		}
		m.serving[r.Role] += ok
		if r.Role == "embedding" && r.Shard != "" {
			var k, n int
			if _, err := fmt.Sscanf(r.Shard, "%d/%d", &k, &n); err == nil && n > m.shards {
				m.shards = n
			}
			m.shard[r.Shard] += ok
		}
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(models)) {
		m := models[name]
		for _, role := range []string{"embedding", "dense"} {
			if m.serving[role] == 0 && (role == "dense" || m.shards == 0) {
				out = append(out, fmt.Sprintf("%s: no %s worker serving it", name, role))
			}
		}
		for k := range m.shards {
			if shard := fmt.Sprintf("%d/%d", k, m.shards); m.shard[shard] == 0 {
				out = append(out, fmt.Sprintf("%s: no embedding worker serving shard %s", name, shard))
			}
		}
	}
	return out
}

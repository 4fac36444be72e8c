package router

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/sequencer from what the sequencer does")

// TestSequencer runs the scripts in testdata/sequencer: each block is one
// event (or query) of the sequencer, and below "----" the messages it
// sends, one a line. No goroutines, no sleeps: the clock is logical.
//
// Commands (defaults in brackets):
//
//	new [heartbeat=1s] [log-bytes=268435456] [total-bytes=0] [quorum=one] [persist=hide|show] [epoch=0] [worker-timeout=0s] [merge-bytes=N]
//	                                           a router starting now (the
//	                                           scripts from before quorums
//	                                           assume one; show prints the
//	                                           update log writes; epoch: its
//	                                           hold's election epoch, which
//	                                           every apply carries;
//	                                           worker-timeout: the driver's
//	                                           per-worker update timeout,
//	                                           the sequencer made as
//	                                           newUpdateDriver makes it;
//	                                           merge-bytes: the bound of a
//	                                           merged update, 0: none merge)
//	restart [after=0s]                         the router restarts from what
//	                                           its update log holds
//	advance <duration>                         the clock moves on
//	announce <worker> [models=m] [seq=m:N,...] [role=dense] [shard=K/N] [tables=t,...] [split=t:K.K.K:rows,...] [complete=yes|no] [sharding=FP]
//	                                           shard: it holds shard K of N
//	                                           of each of its models, tables
//	                                           those of them it holds, split
//	                                           the row-wise tables' rows (row
//	                                           r on the (r mod n)-th K listed);
//	                                           complete=no: a worker of an
//	                                           earlier release (row splits not
//	                                           said to be complete); sharding:
//	                                           the sharding's fingerprint
//	                                           diverged=m:N,...: its store's
//	                                           diverged marks (WorkerInfo.diverged)
//	told <worker>                              the diverged marks the answer to
//	                                           the worker's announcement carries
//	gone <worker>                              left, expired or removed
//	propose <client> [model=m] [table=t] [ids=1|ids=3.9.12] [width=1] [deadline=10s]
//	                                           ids: how many (each 0), or the
//	                                           ids, dot-separated (7.: the one
//	                                           id 7); width: the
//	                                           floats per row, each the
//	                                           client's number
//	cancel <client> [code=Canceled]            the client's context ended
//	applied <client|replay> <worker> <seq> [model=m] [code=OK|timeout|fenced]
//	                                           model: the sequence, m#shardK
//	                                           for a shard's; fenced: the
//	                                           worker heard of the next epoch
//	                                           (prismv1.StaleEpochError)
//	tick [after=0s]                            a heartbeat
//	resign                                     another router sequences now
//	serving [model=m]                          which live workers may serve
//	state [model=m]                            the model's sequence
//	entry <seq> [model=m]                      what the log holds as update
//	                                           seq: ids, and whose each row is
//	writes fail|ok                             from now on the update log's
//	                                           writes fail (or succeed again)
//
// The messages of each event are carried out as updateDriver does:
// persists written (a rewrite's success reported with rewritten), an
// apply above what the log holds not sent ("apply ...: not sent", then
// reported with errNotLogged), and while writes fail a step with a
// persist writes nothing and is reported with writeFailed ("write
// failed"); the messages that follow are carried out likewise.
func TestSequencer(t *testing.T) {
	files, err := filepath.Glob("testdata/sequencer/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runSequencerScript(t, file) })
	}
}

type seqScript struct {
	t   *testing.T
	s   *sequencer
	now time.Time
	// What the last new set, for restart.
	heartbeat  time.Duration
	logBytes   int64
	totalBytes int64
	quorum     Quorum
	// workerTimeout: the sequencer is made as newUpdateDriver makes it
	// with that per-worker update timeout (0: newSequencer alone).
	workerTimeout time.Duration
	// mergeBytes: the sequencer's bound of a merged update (-1: its
	// default).
	mergeBytes  int64
	showPersist bool
	// disk is the update log as the persists wrote it; durable what it
	// holds every entry up to (updateDriver.durable); failWrites: every
	// write fails.
	disk       map[string]*diskModel
	durable    map[string]int64
	failWrites bool
	// copy is a following router's copy of this sequencer's log
	// (replica.go), taken by copy, started from by take-over; term
	// names the sequencer's term, epoch its hold's election epoch.
	copy  replica
	term  uint64
	epoch uint64
}

// diskModel is one model's update log as written.
type diskModel struct {
	next, committed, floor int64
	entries                map[int64]*prismv1.ApplyUpdateRequest
	diverged               map[string]int64
	outcomes               map[int64]int8
}

// write applies a persist as the driver's updateLog would.
func (h *seqScript) write(m message) {
	d := h.disk[m.Model]
	if d == nil {
		d = &diskModel{entries: map[int64]*prismv1.ApplyUpdateRequest{}}
		h.disk[m.Model] = d
	}
	c := m.Persist
	for seq := c.DropFrom + 1; seq <= c.Floor; seq++ {
		delete(d.entries, seq)
		delete(d.outcomes, seq)
	}
	for seq, v := range c.Outcomes {
		if seq > c.Floor && seq <= c.Next {
			if d.outcomes == nil {
				d.outcomes = map[int64]int8{}
			}
			d.outcomes[seq] = v
		}
	}
	if c.Entry != nil {
		d.entries[c.Entry.GetSeq()] = c.Entry
	}
	for _, e := range c.Entries {
		d.entries[e.GetSeq()] = e
	}
	d.next, d.committed, d.floor, d.diverged = c.Next, c.Committed, c.Floor, c.Diverged
	if c.Entry != nil || c.Rewrite != 0 || c.Floor == c.Next {
		h.durable[m.Model] = c.Next
	}
}

// newSeq is a new sequencer at now, as the router makes it: through
// newUpdateDriver when the script names a worker timeout.
func (h *seqScript) newSeq() *sequencer {
	s := newSequencer(h.now, h.heartbeat, h.logBytes, h.totalBytes, h.quorum)
	if h.workerTimeout > 0 {
		newUpdateDriver(s, func() time.Time { return h.now }, nil, time.Second, h.workerTimeout, nil)
	}
	if h.mergeBytes >= 0 {
		s.mergeBytes = h.mergeBytes
	}
	return s
}

// restart is a new sequencer at now restored from disk.
func (h *seqScript) restart() []string {
	h.s = h.newSeq()
	var out []string
	for _, model := range slices.Sorted(maps.Keys(h.disk)) {
		d := h.disk[model]
		var log []*prismv1.ApplyUpdateRequest
		for seq := d.floor + 1; seq <= d.next; seq++ {
			e := d.entries[seq]
			if e == nil {
				h.t.Fatalf("restart: the log of %s lacks update %d (floor %d, next %d)", model, seq, d.floor, d.next)
			}
			log = append(log, e)
		}
		if len(d.entries) != len(log) {
			h.t.Fatalf("restart: the log of %s holds %d entries, want %d (trimmed ones left behind)", model, len(d.entries), len(log))
		}
		h.s.restore(model, d.next, d.committed, d.floor, log)
		h.s.restoreDiverged(model, d.diverged)
		h.s.restoreOutcomes(model, d.outcomes)
		h.durable[model] = d.next
		line := fmt.Sprintf("restored %s next=%d committed=%d floor=%d", model, d.next, d.committed, d.floor)
		if len(d.diverged) > 0 {
			line += " diverged=" + strings.Join(slices.Sorted(maps.Keys(d.diverged)), ",")
		}
		if len(d.outcomes) > 0 {
			line += " outcomes=" + outcomesString(d.outcomes)
		}
		out = append(out, line)
	}
	return append(out, h.carry(h.s.ready())...)
}

func runSequencerScript(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := &seqScript{t: t, now: time.Unix(1000, 0), heartbeat: time.Second, logBytes: 256 << 20, quorum: QuorumOne, mergeBytes: -1, disk: map[string]*diskModel{}, durable: map[string]int64{}}
	h.s = newSequencer(h.now, h.heartbeat, h.logBytes, h.totalBytes, h.quorum)
	var out strings.Builder
	sc := bufio.NewScanner(f)
	lineNo := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		lineNo++
		return sc.Text(), true
	}
	for {
		line, ok := next()
		if !ok {
			break
		}
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		cmdLine := lineNo
		if sep, ok := next(); !ok || sep != "----" {
			t.Fatalf("%s:%d: %q is not followed by ----", file, cmdLine, line)
		}
		var want []string
		for {
			l, ok := next()
			if !ok || l == "" {
				break
			}
			want = append(want, l)
		}
		got := h.do(line)
		fmt.Fprintf(&out, "%s\n----\n", line)
		for _, g := range got {
			out.WriteString(g + "\n")
		}
		out.WriteString("\n")
		if !*rewrite && !slices.Equal(got, want) {
			t.Errorf("%s:%d: %s\ngot:\n\t%s\nwant:\n\t%s", file, cmdLine, line, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// do runs one command and returns what it printed: the messages the
// sequencer sent, or the answer to a query.
func (h *seqScript) do(line string) []string {
	fields := strings.Fields(line)
	cmd, pos, kv := fields[0], []string{}, map[string]string{}
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		} else {
			pos = append(pos, f)
		}
	}
	arg := func(k, def string) string {
		if v, ok := kv[k]; ok {
			return v
		}
		return def
	}
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			h.t.Fatalf("%s: %v", line, err)
		}
		return d
	}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			h.t.Fatalf("%s: %v", line, err)
		}
		return n
	}
	client := func(s string) uint64 {
		if s == "replay" {
			return 0
		}
		return uint64(num(strings.TrimPrefix(s, "c")))
	}
	need := func(n int) {
		if len(pos) != n {
			h.t.Fatalf("%s: want %d arguments", line, n)
		}
	}
	model := arg("model", "m")
	switch cmd {
	case "new":
		q, err := ParseQuorum(arg("quorum", "one"))
		if err != nil {
			h.t.Fatalf("%s: %v", line, err)
		}
		h.heartbeat, h.logBytes, h.quorum, h.showPersist = dur(arg("heartbeat", "1s")), num(arg("log-bytes", "268435456")), q, arg("persist", "hide") == "show"
		h.totalBytes = num(arg("total-bytes", "0"))
		h.workerTimeout = dur(arg("worker-timeout", "0s"))
		h.mergeBytes = num(arg("merge-bytes", "-1"))
		h.disk, h.durable, h.failWrites = map[string]*diskModel{}, map[string]int64{}, false
		h.s = h.newSeq()
		h.s.epoch = uint64(num(arg("epoch", "0")))
	case "restart":
		h.now = h.now.Add(dur(arg("after", "0s")))
		return h.restart()
	case "advance":
		need(1)
		h.now = h.now.Add(dur(pos[0]))
	case "announce":
		need(1)
		w := &prismv1.WorkerInfo{Id: pos[0], Addr: "addr-" + pos[0], Role: prismv1.Role_ROLE_EMBEDDING, Models: strings.Split(arg("models", "m"), ","), UpdateSeq: map[string]int64{}}
		if arg("role", "") == "dense" {
			w.Role = prismv1.Role_ROLE_DENSE
		}
		if s := arg("seq", ""); s != "" {
			for _, p := range strings.Split(s, ",") {
				m, n, _ := strings.Cut(p, ":")
				w.UpdateSeq[m] = num(n)
			}
		}
		if s := arg("diverged", ""); s != "" {
			w.Diverged = map[string]int64{}
			for _, p := range strings.Split(s, ",") {
				m, n, _ := strings.Cut(p, ":")
				w.Diverged[m] = num(n)
			}
		}
		if s := arg("shard", ""); s != "" {
			k, n, _ := strings.Cut(s, "/")
			w.Shards = map[string]*prismv1.ShardRef{}
			var tables []string
			if t := arg("tables", ""); t != "" {
				tables = strings.Split(t, ",")
			}
			var splits []*prismv1.RowSplit
			if sp := arg("split", ""); sp != "" {
				for _, one := range strings.Split(sp, ",") {
					f := strings.Split(one, ":")
					if len(f) != 3 {
						h.t.Fatalf("%s: split %q: want table:K.K:rows", line, one)
					}
					r := &prismv1.RowSplit{Table: f[0], Rows: num(f[2])}
					for _, k := range strings.Split(f[1], ".") {
						r.Shards = append(r.Shards, int32(num(k)))
					}
					splits = append(splits, r)
				}
			}
			for _, m := range w.Models {
				w.Shards[m] = &prismv1.ShardRef{Shard: int32(num(k)), Shards: int32(num(n)), Tables: tables, RowSplits: splits, RowSplitsComplete: arg("complete", "yes") == "yes", Sharding: arg("sharding", "")}
			}
		}
		h.s.announced(h.now, w)
	case "told":
		need(1)
		w := h.s.workers[pos[0]]
		if w == nil {
			return []string{"not live"}
		}
		var out []string
		d := h.s.divergedOf(w)
		for _, m := range slices.Sorted(maps.Keys(d)) {
			out = append(out, fmt.Sprintf("diverged %s at %d", m, d[m]))
		}
		return out
	case "gone":
		need(1)
		h.s.gone(h.now, pos[0])
	case "propose":
		need(1)
		var ids []int64
		if list := arg("ids", "1"); strings.Contains(list, ".") {
			for _, id := range strings.Split(list, ".") {
				if id != "" { // "7." is the one id 7
					ids = append(ids, num(id))
				}
			}
		} else {
			ids = make([]int64, num(list))
		}
		// Each row's floats are the client's number: entry shows whose
		// row a merged update carries where.
		width := int(num(arg("width", "1")))
		rows := make([]byte, 0, 4*width*len(ids))
		for range width * len(ids) {
			rows = binary.LittleEndian.AppendUint32(rows, math.Float32bits(float32(client(pos[0]))))
		}
		req := &prismv1.UpdateRequest{Model: model, Table: arg("table", "t"), Ids: ids, Rows: rows}
		h.s.propose(h.now, client(pos[0]), req, h.now.Add(dur(arg("deadline", "10s"))))
	case "cancel":
		need(1)
		h.s.cancel(h.now, client(pos[0]), status.Error(codeNamed(h.t, arg("code", "Canceled")), "context canceled"))
	case "applied":
		need(3)
		var err error
		if arg("code", "") == "timeout" {
			err = errWorkerTimeout
		} else if arg("code", "") == "fenced" {
			err = prismv1.StaleEpochError(model, num(pos[2]), h.s.epoch, h.s.epoch+1)
		} else if c := codeNamed(h.t, arg("code", "OK")); c != codes.OK {
			err = status.Error(c, "worker says "+c.String())
		}
		h.s.applied(h.now, client(pos[0]), model, pos[1], num(pos[2]), err)
	case "tick":
		h.now = h.now.Add(dur(arg("after", "0s")))
		h.s.tick(h.now)
	case "resign":
		h.s.resign(h.now)
	case "describe":
		// What Registry/List says of each sequence (prism status reads it).
		var out []string
		d := h.s.describe(h.now)
		for _, key := range slices.Sorted(maps.Keys(d)) {
			u := d[key]
			out = append(out, fmt.Sprintf("%s: acknowledged=%d numbered=%d in_sync=%s left_out=%s stranded=%s settling=%v", key,
				u.GetAcknowledged(), u.GetNumbered(), strings.Join(u.GetInSync(), ","), strings.Join(u.GetLeftOut(), ","), strings.Join(u.GetStranded(), ","), u.GetSettling()))
		}
		return out
	case "serving":
		var out []string
		for _, id := range slices.Sorted(maps.Keys(h.s.workers)) {
			out = append(out, fmt.Sprintf("%s: %v", id, h.s.inSync(h.s.workers[id], model, h.now)))
		}
		return out
	case "copy":
		// A follower pulls the log, in answers of at most page-bytes, as
		// many as it takes; the answers carry the holder's epoch (epoch=N:
		// another, an answer from an earlier hold arriving late).
		if h.term == 0 {
			h.term, h.epoch = 1, 1
		}
		epoch := uint64(num(arg("epoch", fmt.Sprint(h.epoch))))
		var out []string
		for page := 1; ; page++ {
			term, after := h.copy.after()
			models, more := h.s.readLog(after, term != h.term, num(arg("page-bytes", "16777216")))
			if err := h.copy.merge(&prismv1.UpdateLogResponse{Term: h.term, Epoch: epoch, Models: models, More: more}); err != nil {
				out = append(out, "error: "+err.Error())
			}
			if !more {
				break
			}
			out = append(out, fmt.Sprintf("page %d", page))
			if page == int(num(arg("pages", "0"))) {
				break // the holder is lost mid-pull (pages=N)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(h.copy.models)) {
			rm := h.copy.models[name]
			line := fmt.Sprintf("copy %s next=%d committed=%d floor=%d holds=%d..%d epoch=%d", name, rm.next, rm.committed, rm.floor, rm.floor+1, rm.end(), h.copy.epoch)
			if len(rm.diverged) > 0 {
				line += " diverged=" + strings.Join(slices.Sorted(maps.Keys(rm.diverged)), ",")
			}
			if o := outcomeMap(rm.outcomes, rm.floor, rm.next); len(o) > 0 {
				line += " outcomes=" + outcomesString(o)
			}
			out = append(out, line)
		}
		return out
	case "take-over":
		// The copy's router is elected (epoch=N: its hold's epoch, by
		// default the next): a new term's sequencer, started from the
		// copy (no disk).
		h.now = h.now.Add(dur(arg("after", "0s")))
		if h.term == 0 {
			h.term, h.epoch = 1, 1
		}
		h.epoch = uint64(num(arg("epoch", fmt.Sprint(h.epoch+1))))
		h.s = h.newSeq()
		h.s.epoch = h.epoch
		h.term++
		h.disk, h.durable = map[string]*diskModel{}, map[string]int64{}
		models, updates, stale := h.copy.restoreTo(h.s, h.epoch)
		for name, m := range h.s.models {
			h.durable[name] = m.next // an in-memory log holds what it holds
		}
		out := []string{fmt.Sprintf("took over from the copy: models=%d updates=%d stale=%v", models, updates, stale)}
		return append(out, h.carry(h.s.ready())...)
	case "state":
		return []string{h.state(model)}
	case "entry":
		// What the update log holds as update seq of model: its table,
		// ids and whose row each is (the client a row's floats name).
		need(1)
		m := h.s.models[model]
		seq := num(pos[0])
		if m == nil || seq <= m.floor || seq > m.next {
			return []string{"not in the log"}
		}
		u := m.log[seq-m.floor-1].GetUpdate()
		width := len(u.GetRows()) / len(u.GetIds())
		var whose []string
		for i := range u.GetIds() {
			whose = append(whose, fmt.Sprintf("c%v", math.Float32frombits(binary.LittleEndian.Uint32(u.GetRows()[i*width:]))))
		}
		return []string{fmt.Sprintf("%s#%d: table %s, ids %v, rows of %d bytes from %s", model, seq, u.GetTable(), u.GetIds(), width, strings.Join(whose, " "))}
	case "writes":
		need(1)
		h.failWrites = pos[0] == "fail"
		return nil
	default:
		h.t.Fatalf("unknown command %q", line)
	}
	return h.carry(h.s.ready())
}

// carry carries out msgs, the messages of one event, as updateDriver.step
// does, and returns what they print.
func (h *seqScript) carry(msgs []message) []string {
	var out []string
	if h.failWrites && slices.ContainsFunc(msgs, func(m message) bool { return m.Type == msgPersist }) {
		for _, m := range msgs {
			switch {
			case m.Type == msgPersist && !h.showPersist:
			case m.Type == msgApply:
				out = append(out, m.String()+": not sent")
			default:
				out = append(out, m.String())
			}
		}
		out = append(out, "write failed")
		h.s.writeFailed(h.now, msgs)
		return append(out, h.carry(h.s.ready())...)
	}
	var notSent []message
	rewrote := false
	for _, m := range msgs {
		if m.Type == msgPersist {
			h.write(m)
			rewrote = rewrote || m.Persist.Rewrite != 0
		}
	}
	for _, m := range msgs {
		switch {
		case m.Type == msgPersist && !h.showPersist:
		case m.Type == msgApply && m.Apply.GetSeq() > h.durable[m.Model]:
			notSent = append(notSent, m)
			out = append(out, m.String()+": not sent")
		default:
			out = append(out, m.String())
		}
	}
	for _, m := range notSent {
		h.s.applied(h.now, m.Client, m.Model, m.Worker, m.Apply.GetSeq(), errNotLogged)
	}
	if rewrote {
		for _, m := range msgs {
			if m.Type == msgPersist && m.Persist.Rewrite != 0 {
				h.s.rewritten(h.now, m.Model, m.Persist.Rewrite)
			}
		}
	}
	if len(notSent) > 0 || rewrote {
		out = append(out, h.carry(h.s.ready())...)
	}
	return out
}

func codeNamed(t *testing.T, name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	t.Fatalf("no code %q", name)
	return 0
}

func (h *seqScript) state(model string) string {
	m := h.s.models[model]
	if m == nil {
		return "no state"
	}
	ids := func(set map[string]bool) string {
		return strings.Join(slices.Sorted(maps.Keys(set)), ",")
	}
	var known []string
	for _, id := range slices.Sorted(maps.Keys(m.known)) {
		known = append(known, fmt.Sprintf("%s:%d", id, m.known[id]))
	}
	var queue []string
	for _, p := range m.queue {
		queue = append(queue, fmt.Sprintf("c%d", p.client))
	}
	inflight := "-"
	if f := m.inflight; f != nil {
		var clients []string
		for _, p := range f.parts {
			clients = append(clients, fmt.Sprintf("c%d", p.client))
		}
		inflight = fmt.Sprintf("%s#%d waiting %s", strings.Join(clients, "+"), f.seq, strings.Join(slices.Sorted(maps.Keys(f.waiting)), ","))
	}
	out := fmt.Sprintf("next=%d committed=%d log=%d..%d (%d bytes) known=%s catching=%s stale=%s queue=%s inflight=%s",
		m.next, m.committed, m.floor+1, m.next, m.bytes, strings.Join(known, ","), ids(m.catching), ids(m.stale), strings.Join(queue, ","), inflight)
	// Only when set, so the scripts written before them read the same.
	if len(m.foreign) > 0 {
		out += " foreign=" + strings.Join(slices.Sorted(maps.Keys(m.foreign)), ",")
	}
	if len(m.slow) > 0 {
		out += " slow=" + ids(m.slow)
	}
	if m.owed > m.next {
		out += fmt.Sprintf(" owed=%d", m.owed)
	}
	if len(m.diverged) > 0 {
		out += " diverged=" + strings.Join(slices.Sorted(maps.Keys(m.diverged)), ",")
	}
	if m.unwritten {
		out += " unwritten"
	}
	return out
}

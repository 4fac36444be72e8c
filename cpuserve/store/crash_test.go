package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// Crash test: a child process (this test binary, re-executed) ingests a
// plan as model m, a second version of it (table a differs, b is shared)
// and the first plan again as model o (sharing m's tables), and then
// applies upserts to m, printing "ack N" after each Upsert returns and
// switching m's version every crashSwitchEvery upserts; the first upsert
// copies the table m shares with o. The parent SIGKILLs it at a random
// point, reopens the store and checks that every acknowledged upsert is
// there whichever version is active, that o never reads m's updates, and
// that no table is served half-ingested. The next child resumes the ingest.

const (
	crashEnvDir   = "PRISM_STORE_CRASH_DIR"
	crashEnvPlan  = "PRISM_STORE_CRASH_PLAN"
	crashEnvPlan2 = "PRISM_STORE_CRASH_PLAN2"
	crashEnvStart = "PRISM_STORE_CRASH_START"
	crashRows     = 40000
	crashDim      = 16
	// crashSwitchEvery is how many upserts the child applies between
	// switches of m's version.
	crashSwitchEvery = 300
)

// crashReady is the child's line once its ingest is done and upserts begin.
var crashReady = readyline.New("ready")

// crashRow is the value upsert n writes to row n of table "a".
func crashRow(n int) []float32 {
	row := make([]float32, crashDim)
	for k := range row {
		row[k] = float32(n) + float32(k)/100
	}
	return row
}

func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnvDir)
	if dir == "" {
		t.Skip("only run as the crash test's child process")
	}
	start, _ := strconv.Atoi(os.Getenv(crashEnvStart))
	s, err := Open(dir, &Options{HotBytes: 1 << 20})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	ctx := context.Background()
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(2)
	}
	if _, err := s.Tables("m"); err != nil {
		if _, err := s.Ingest(ctx, os.Getenv(crashEnvPlan), IngestOptions{SSTBytes: 64 << 10}); err != nil {
			fail(err)
		}
	}
	if vs, err := s.Versions("m"); err != nil {
		fail(err)
	} else if len(vs) == 1 {
		if _, err := s.Ingest(ctx, os.Getenv(crashEnvPlan2), IngestOptions{SSTBytes: 64 << 10, NoActivate: true}); err != nil {
			fail(err)
		}
	}
	if _, err := s.Tables("o"); err != nil {
		if _, err := s.Ingest(ctx, os.Getenv(crashEnvPlan), IngestOptions{Model: "o", SSTBytes: 64 << 10}); err != nil {
			fail(err)
		}
	}
	crashReady.Write(os.Stdout, "")
	for n := start; n < crashRows; n++ {
		if n%crashSwitchEvery == crashSwitchEvery-1 {
			vs, err := s.Versions("m")
			if err != nil {
				fail(err)
			}
			for _, v := range vs {
				if !v.Active {
					if err := s.Activate("m", v.N); err != nil {
						fail(err)
					}
					break
				}
			}
		}
		if err := s.Upsert("m", "a", []int64{int64(n)}, crashRow(n)); err != nil {
			fail(err)
		}
		fmt.Printf("ack %d\n", n) // stdout is unbuffered: the parent sees the ack once it is given
		// Keep the hot tier busy with the rows just written.
		r := TableLookup{Table: "a", IDs: []int64{int64(n), int64(n / 2)}, Out: make([]float32, 2*crashDim)}
		if err := s.Lookup("m", []TableLookup{r}); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
	}
	select {}
}

func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	tabs := []*testTable{{name: "a", rows: crashRows, dim: crashDim, seed: 9}, {name: "b", rows: 20000, dim: 32, seed: 10}}
	tabs2 := []*testTable{{name: "a", rows: crashRows, dim: crashDim, seed: 19}, {name: "b", rows: 20000, dim: 32, seed: 10}}
	plan, plan2 := writePlan(t, "m", tabs), writePlan(t, "m", tabs2)
	dir := filepath.Join(t.TempDir(), "db")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[int]bool{}
	next := 0
	sawIngestKill := false
	for round := range 6 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v=false")
		cmd.Env = append(os.Environ(), crashEnvDir+"="+dir, crashEnvPlan+"="+plan, crashEnvPlan2+"="+plan2, crashEnvStart+"="+strconv.Itoa(next))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The first rounds die early (during the ingest, likely); later
		// ones among the upserts: their clock starts when the child is
		// ready, however long its ingest took (under -race, longer than
		// any fixed delay).
		// Round 2 likely dies in the first upsert's copy of the shared
		// table; from round 3 the clock starts at the round's first ack,
		// so some upserts are acknowledged even when that copy is slow.
		delay := time.Duration(r.IntN(150)) * time.Millisecond
		afterReady, afterAck := round >= 2, round >= 3
		if afterReady {
			delay = time.Duration(r.IntN(400)) * time.Millisecond
		}
		lines := make(chan string, 1024)
		w := readyline.Start(out, crashReady, readyline.WatchOptions{Echo: func(l string) { lines <- l }})
		go func() { <-w.Done(); close(lines) }()
		readyc := w.Ready()
		var killAt <-chan time.Time
		if !afterReady {
			killAt = time.After(delay)
		}
		giveUp := time.After(3 * time.Minute)
		ready := false
	read:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break read
				}
				if err := t.Context().Err(); err != nil {
					break read
				}
				switch {
				case strings.HasPrefix(l, "ack "):
					n, _ := strconv.Atoi(l[4:])
					acked[n] = true
					next = max(next, n+1)
					if afterAck && killAt == nil {
						killAt = time.After(delay)
					}
				case strings.HasPrefix(l, "error"):
					t.Fatalf("child: %s", l)
				}
			case _, ok := <-readyc:
				readyc = nil
				if ok {
					ready = true
					if killAt == nil && !afterAck {
						killAt = time.After(delay)
					}
				}
			case <-killAt:
				break read
			case <-giveUp:
				_ = cmd.Process.Signal(syscall.SIGKILL)
				t.Fatalf("round %d: the child was not ready after 3 minutes", round)
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for l := range lines { // acks written before the kill still count
			if strings.HasPrefix(l, "ack ") {
				n, _ := strconv.Atoi(l[4:])
				acked[n] = true
				next = max(next, n+1)
			}
		}
		if readyc != nil { // a ready line the loop above did not take
			if _, ok := <-readyc; ok {
				ready = true
			}
		}
		_ = cmd.Wait()
		if !ready {
			sawIngestKill = true
		}

		s, err := Open(dir, &Options{HotBytes: 1 << 20})
		if err != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, err)
		}
		infos, err := s.Tables("m")
		switch {
		case err != nil && ready:
			t.Fatalf("round %d: model lost after its ingest finished: %v", round, err)
		case err != nil:
			// Killed mid-ingest: nothing is served, which is right.
		default:
			if len(infos) != 2 {
				t.Fatalf("round %d: %d tables served, want 2", round, len(infos))
			}
			vs, err := s.Versions("m")
			if err != nil {
				t.Fatal(err)
			}
			base := tabs
			for _, v := range vs {
				if v.Active && v.N == 2 {
					base = tabs2
				}
			}
			verifyCrashStore(t, s, "m", base, acked, round)
			if _, err := s.Tables("o"); err == nil {
				verifyCrashStore(t, s, "o", tabs, nil, round)
			}
		}
		s.Close()
		t.Logf("round %d: killed after %v, ready=%v, %d acks so far", round, delay, ready, len(acked))
	}
	if len(acked) == 0 {
		t.Errorf("no upsert was acknowledged in any round")
	}
	t.Logf("killed during ingest in some round: %v", sawIngestKill)
}

// verifyCrashStore reads every row of both tables: acknowledged upserts
// hold their value, untouched rows their ingested value, and a row whose
// upsert was in flight at the kill holds one or the other.
func verifyCrashStore(t *testing.T, s *Store, model string, tabs []*testTable, acked map[int]bool, round int) {
	t.Helper()
	for _, tt := range tabs {
		ids := make([]int64, tt.rows)
		for i := range ids {
			ids[i] = int64(i)
		}
		r := TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, len(ids)*tt.dim)}
		if err := s.Lookup(model, []TableLookup{r}); err != nil {
			t.Fatalf("round %d: model %s: %v", round, model, err)
		}
		for i := range ids {
			got := r.Out[i*tt.dim : (i+1)*tt.dim]
			orig := tt.data[i*tt.dim : (i+1)*tt.dim]
			if tt.name == "a" && acked[i] {
				if !slicesEqual(got, crashRow(i)) {
					t.Fatalf("round %d: model %s: acknowledged upsert %d lost: row reads %v", round, model, i, got[:3])
				}
				continue
			}
			if !slicesEqual(got, orig) && !(acked != nil && tt.name == "a" && slicesEqual(got, crashRow(i))) {
				t.Fatalf("round %d: model %s table %s row %d is neither ingested nor upserted: %v", round, model, tt.name, i, got[:3])
			}
		}
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

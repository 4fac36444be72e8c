package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestRegistryDenseListOnChange: an answer to an embedding worker
// carries the dense workers' list only when the worker does not hold
// the list's version (AnnounceRequest.dense_held): at its first
// announcement, after a dense worker joined or left, when it holds
// another router process's version (a router restarted, another
// router), and always when it sends none (a worker of an earlier
// release). Otherwise the answer says dense_unchanged and carries no
// list, with the version the worker holds. Steps run in order on one
// registry ("restart" starts another with the same dense workers).
func TestRegistryDenseListOnChange(t *testing.T) {
	type step struct {
		name string
		// do changes the dense workers before the announcement: "join
		// ADDR", "leave ADDR", "again ADDR" (a dense worker's heartbeat,
		// nothing changed), "restart".
		do string
		// held is the version the embedding worker announces: "last"
		// (the last one answered), "none" (a worker of an earlier
		// release), "stale" (the one answered before the last change),
		// "forged" (process 0, which names no list).
		held string
		// want is the list the answer carries, "-" for none
		// (dense_unchanged); newVersion says the version differs from
		// the last one answered.
		want       string
		newVersion bool
	}
	steps := []step{
		{name: "first announcement", held: "none", want: "d:1,d:2", newVersion: true},
		{name: "held: left out", held: "last", want: "-"},
		{name: "held again: left out", held: "last", want: "-"},
		{name: "dense heartbeat changes nothing", do: "again d:1", held: "last", want: "-"},
		{name: "a dense worker joins", do: "join d:3", held: "last", want: "d:1,d:2,d:3", newVersion: true},
		{name: "the new list held", held: "last", want: "-"},
		{name: "a dense worker leaves", do: "leave d:1", held: "last", want: "d:2,d:3", newVersion: true},
		{name: "a version before the change", held: "stale", want: "d:2,d:3"},
		{name: "an old worker: always the list", held: "none", want: "d:2,d:3"},
		{name: "an old worker again", held: "none", want: "d:2,d:3"},
		{name: "process 0 names no list", held: "forged", want: "d:2,d:3"},
		{name: "router restarted with the same dense workers", do: "restart", held: "last", want: "d:2,d:3", newVersion: true},
		{name: "its list held", held: "last", want: "-"},
		{name: "another leaves", do: "leave d:2", held: "last", want: "d:3", newVersion: true},
		{name: "the last leaves: an empty list, not left out", do: "leave d:3", held: "last", want: "", newVersion: true},
		{name: "none, held", held: "last", want: "-"},
	}
	dense := func(addr string) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: "dense-" + addr, Role: prismv1.Role_ROLE_DENSE, Addr: addr, Models: []string{"m"}, Healthy: true}
	}
	emb := &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"m"}}
	var r *Registry
	start := func(addrs ...string) {
		r = NewRegistry(time.Second, nil)
		for _, a := range addrs {
			if err := announceW(r, context.Background(), dense(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	start("d:2", "d:1")
	var last, stale *prismv1.ListVersion
	for _, s := range steps {
		verb, addr, _ := strings.Cut(s.do, " ")
		switch verb {
		case "join", "again":
			if err := announceW(r, context.Background(), dense(addr)); err != nil {
				t.Fatal(err)
			}
		case "leave":
			if _, err := r.Leave(context.Background(), &prismv1.LeaveRequest{Id: "dense-" + addr}); err != nil {
				t.Fatal(err)
			}
		case "restart":
			start(r.DenseAddrs()...)
		}
		req := &prismv1.AnnounceRequest{Worker: proto.Clone(emb).(*prismv1.WorkerInfo)}
		switch s.held {
		case "last":
			req.DenseHeld = last
		case "stale":
			req.DenseHeld = stale
		case "forged":
			req.DenseHeld = &prismv1.ListVersion{Gen: last.GetGen()}
		}
		resp, err := r.Announce(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := strings.Join(resp.GetDenseAddrs(), ",")
		if resp.GetDenseUnchanged() {
			if len(resp.GetDenseAddrs()) != 0 {
				t.Fatalf("%s: dense_unchanged with a list %q", s.name, got)
			}
			got = "-"
		}
		if got != s.want {
			t.Errorf("%s: answer carries %q, want %q", s.name, got, s.want)
		}
		v := resp.GetDenseVersion()
		if v.GetProcess() == 0 || v.GetGen() == 0 {
			t.Fatalf("%s: answer's version %v, want one set", s.name, v)
		}
		if renamed := !prismv1.SameList(v, last); renamed != s.newVersion {
			t.Errorf("%s: version %v after %v: new %v, want %v", s.name, v, last, renamed, s.newVersion)
		}
		if s.newVersion {
			stale, last = last, v
		}
	}
}

// TestRegistryDenseListNotToDense: a dense worker's answer carries no
// list and no version, whatever it announces it holds.
func TestRegistryDenseListNotToDense(t *testing.T) {
	r := NewRegistry(time.Second, nil)
	d := &prismv1.WorkerInfo{Id: "d", Role: prismv1.Role_ROLE_DENSE, Addr: "d:1", Models: []string{"m"}, Healthy: true}
	resp, err := r.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: d, DenseHeld: &prismv1.ListVersion{Process: 1, Gen: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDenseAddrs() != nil || resp.GetDenseVersion() != nil || resp.GetDenseUnchanged() {
		t.Fatalf("a dense worker's answer: %v", resp)
	}
}

// TestRegistryDenseVersionPerProcess: two registries (a router and its
// restart, or two routers) never name their lists alike, so a version
// held from one is never taken by the other for its own.
func TestRegistryDenseVersionPerProcess(t *testing.T) {
	seen := map[uint64]bool{}
	for range 64 {
		p := NewRegistry(time.Second, nil).denseVersion.GetProcess()
		if p == 0 || seen[p] {
			t.Fatalf("process number %d drawn twice or zero", p)
		}
		seen[p] = true
	}
}

package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestRetire: a model removed from the workers' plans (each worker
// restarted at its address without it, as a rollout does) is retired:
// out of prism_router_model_workers, whose 0 paged (PrismNoWorkers)
// until the routers restarted, and NotFound once neither tier serves
// it. A worker that dies or leaves retires nothing: its model stays
// known, Unavailable, at 0.
func TestRetire(t *testing.T) {
	type step struct {
		do   string // "announce ID ROLE ADDR MODELS" (models comma-separated, "-" none), "leave ID", "remove ID", "podgone HOST", "podback HOST"
		want string // the models' state after the step: "MODEL e=N d=N" per known model, "e" or "d" left out when retired
	}
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"a rollout drops a model from both tiers", []step{
			{"announce e1 e e:1 a,b", "a e=1 d=0; b e=1 d=0"},
			{"announce d1 d d:1 a,b", "a e=1 d=1; b e=1 d=1"},
			// The embedding worker restarted in place: a new id at its
			// address, which replaces the old one.
			{"announce e2 e e:1 a", "a e=1 d=1; b d=1"},
			{"leave d1", "a e=1 d=0; b d=0"},
			{"announce d2 d d:1 a", "a e=1 d=1"},
		}},
		{"a dense worker restarted in place before its old entry goes", []step{
			{"announce e1 e e:1 a,b", "a e=1 d=0; b e=1 d=0"},
			{"announce d1 d d:1 a,b", "a e=1 d=1; b e=1 d=1"},
			{"announce d2 d d:1 a", "a e=1 d=2; b e=1 d=1"},
			{"remove d1", "a e=1 d=1; b e=1"},
		}},
		{"a worker that dies retires nothing", []step{
			{"announce e1 e e:1 a", "a e=1 d=0"},
			{"announce d1 d d:1 a", "a e=1 d=1"},
			{"remove d1", "a e=1 d=0"},
			{"remove e1", "a e=0 d=0"},
		}},
		{"a worker that leaves and comes back with the model retires nothing", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"leave d1", "a e=0 d=0"},
			{"announce d2 d d:1 a", "a e=0 d=1"},
		}},
		{"another replica keeps the model", []step{
			{"announce d1 d d:1 a,b", "a e=0 d=1; b e=0 d=1"},
			{"announce d2 d d:2 b", "a e=0 d=1; b e=0 d=2"},
			{"leave d1", "a e=0 d=0; b e=0 d=1"},
			{"announce d3 d d:1 a", "a e=0 d=1; b e=0 d=1"},
			// The other replica dies: an outage, not a retirement.
			{"remove d2", "a e=0 d=1; b e=0 d=0"},
		}},
		{"a worker announcing again without a model", []step{
			{"announce e1 e e:1 a,b", "a e=1 d=0; b e=1 d=0"},
			{"announce e1 e e:1 a", "a e=1 d=0"},
			// The model back: served, and its dense tier's 0 shown again.
			{"announce e1 e e:1 a,b", "a e=1 d=0; b e=1 d=0"},
		}},
		// An address is evidence of a worker restarted in place only
		// when its new worker serves some model of the old one's: pod
		// IPs (and a host's ports) are reused, by another model's
		// worker too, while the model whose worker died is down and
		// must go on paging.
		{"another model's worker at a dead worker's address retires nothing", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"remove d1", "a e=0 d=0"},
			{"announce d2 d d:1 b", "a e=0 d=0; b e=0 d=1"},
		}},
		{"another model's worker at the address of one that goes later retires nothing", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"announce d2 d d:1 b", "a e=0 d=1; b e=0 d=1"},
			{"remove d1", "a e=0 d=0; b e=0 d=1"},
		}},
		// After a stop (Leave, as a rollout stops a worker) the next
		// worker at the address is the same one restarted, whatever it
		// serves: a rollout that replaces a worker's every model retires
		// the old ones.
		{"a rollout that replaces a worker's every model", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"leave d1", "a e=0 d=0"},
			{"announce d2 d d:1 b", "b e=0 d=1"},
		}},
		{"the old worker stops after the new one came up at its address", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"announce d2 d d:1 b", "a e=0 d=1; b e=0 d=1"},
			{"leave d1", "b e=0 d=1"},
		}},
		// An embedding worker at an address replaces the one there
		// (replaced): its model is down, not retired.
		{"another model's embedding worker replacing one retires nothing", []step{
			{"announce e1 e e:1 a", "a e=1 d=0"},
			{"announce e2 e e:1 b", "a e=0 d=0; b e=1 d=0"},
		}},
		// On Kubernetes (the chart's watchEndpoints) the router drops a
		// stopping worker when its Pod's endpoint turns terminating,
		// often before the worker's Leave arrives: the Leave of a worker
		// dropped so is still its stop, and the worker that comes up at
		// its address (the chart's POD.SERVICE:PORT) next is it
		// restarted.
		{"a rollout that replaces every model, the Pod gone before the Leave", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"podgone d", "a e=0 d=0"},
			{"leave d1", "a e=0 d=0"},
			{"podback d", "a e=0 d=0"},
			{"announce d2 d d:1 b", "b e=0 d=1"},
		}},
		{"a Pod gone without a Leave retires nothing", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"podgone d", "a e=0 d=0"},
			{"podback d", "a e=0 d=0"},
			{"announce d2 d d:1 b", "a e=0 d=0; b e=0 d=1"},
		}},
		// The Leave of an old entry after its successor at the address
		// announced the same models marks no stop of the successor,
		// which then dies.
		{"the old entry leaves after its successor came up, which dies", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"announce d2 d d:1 a", "a e=0 d=2"},
			{"leave d1", "a e=0 d=1"},
			{"remove d2", "a e=0 d=0"},
			{"announce d3 d d:1 b", "a e=0 d=0; b e=0 d=1"},
		}},
		// A late Leave of a worker whose address another worker has
		// announced at since says nothing of that one.
		{"a late Leave after another worker took the address", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"remove d1", "a e=0 d=0"},
			{"announce d2 d d:1 b", "a e=0 d=0; b e=0 d=1"},
			{"leave d1", "a e=0 d=0; b e=0 d=1"},
			{"remove d2", "a e=0 d=0; b e=0 d=0"},
			{"announce d3 d d:1 c", "a e=0 d=0; b e=0 d=0; c e=0 d=1"},
		}},
		{"a worker at another address retires nothing", []step{
			{"announce d1 d d:1 a", "a e=0 d=1"},
			{"leave d1", "a e=0 d=0"},
			{"announce d2 d d:9 -", "a e=0 d=0"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			reg := NewRegistry(time.Second, func() time.Time { return now })
			ctx := context.Background()
			for i, s := range c.steps {
				f := strings.Fields(s.do)
				var err error
				switch f[0] {
				case "announce":
					role := prismv1.Role_ROLE_EMBEDDING
					if f[2] == "d" {
						role = prismv1.Role_ROLE_DENSE
					}
					var models []string
					if f[4] != "-" {
						models = strings.Split(f[4], ",")
					}
					_, err = reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: f[1], Role: role, Addr: f[3], Models: models, Healthy: true}})
				case "leave":
					_, err = reg.Leave(ctx, &prismv1.LeaveRequest{Id: f[1]})
				case "remove":
					reg.Remove(f[1])
				case "podgone":
					reg.PodGone(PodName{Name: f[1]})
				case "podback":
					reg.PodBack(PodName{Name: f[1]})
				default:
					t.Fatalf("step %q", s.do)
				}
				if err != nil {
					t.Fatalf("step %d %q: %v", i, s.do, err)
				}
				if got := retireState(reg); got != s.want {
					t.Errorf("after step %d %q:\n got %s\nwant %s", i, s.do, got, s.want)
				}
			}
		})
	}
}

// retireState is what prism_router_model_workers says of each model,
// checked against Known: a model listed is known, one not is NotFound.
func retireState(reg *Registry) string {
	var parts []string
	for _, mw := range reg.modelWorkers(maxModelLabels) {
		p := mw.model
		if !reg.Known(mw.model) {
			p += " (not known)"
		}
		if !mw.embeddingRetired {
			p += fmt.Sprintf(" e=%d", mw.embedding)
		}
		if !mw.denseRetired {
			p += fmt.Sprintf(" d=%d", mw.dense)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// TestRetireLeaveAfterDropIsTheOwners: the Leave of a worker already
// dropped (its Pod gone) marks its stop only when it comes from the
// identity the worker was bound to: another certificate's Leave of the
// id retires nothing by the next worker at the address.
func TestRetireLeaveAfterDropIsTheOwners(t *testing.T) {
	for _, c := range []struct {
		name, leaver string
		want         string
	}{
		{"the worker's own identity", "dense-a", "b e=0 d=1"},
		{"another identity", "dense-b", "a e=0 d=0; b e=0 d=1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := NewRegistry(time.Second, nil)
			reg.Peer = fakePeerFunc
			announce := func(id, model string) {
				t.Helper()
				w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: "d:1", Models: []string{model}, Healthy: true}
				if err := announceW(reg, withPeer("dense", "dense-a"), w); err != nil {
					t.Fatal(err)
				}
			}
			announce("d1", "a")
			reg.PodGone(PodName{Name: "d"})
			if _, err := reg.Leave(withPeer("dense", c.leaver), &prismv1.LeaveRequest{Id: "d1"}); err != nil {
				t.Fatal(err)
			}
			reg.PodBack(PodName{Name: "d"})
			announce("d2", "b")
			if got := retireState(reg); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

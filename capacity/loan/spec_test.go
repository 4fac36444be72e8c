package loan

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
)

func TestParseSpec(t *testing.T) {
	sp, err := ParseSpec("local:max=2,capacity=40,tick=250ms,min-lease=5s,cool-down=2s,policy=reactive,p99=50ms,reclaim-after=20s,grace=3s,hold=1m,addr=127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	c := sp.Controller
	if sp.Provider != "local" || sp.Max != 2 || sp.CapacityPerWorker != 40 || sp.Tick != 250*time.Millisecond ||
		c.MinLease != 5*time.Second || c.CoolDown != 2*time.Second || c.Policy != capacity.Reactive || c.P99Limit != 50*time.Millisecond ||
		c.MaxBorrowed != 2 || sp.ReclaimAfter != 20*time.Second || sp.Grace != 3*time.Second || sp.Hold != time.Minute || sp.Addr != "127.0.0.1:9" {
		t.Errorf("parsed %+v", sp)
	}
	if c.High != 0.85 || c.Target != 0.7 {
		t.Errorf("defaults not filled: %+v", c)
	}
	// A zero given is a zero: min-lease=0 and cool-down=0 once read as
	// "the default", 10 and 5 minutes.
	sp, err = ParseSpec("local:max=1,min-lease=0,cool-down=0s")
	if err != nil {
		t.Fatal(err)
	}
	if c := sp.Controller; c.MinLease != 0 || c.CoolDown != 0 || c.Target != 0.7 || c.High != 0.85 || c.Low != 0.7 {
		t.Errorf("min-lease=0,cool-down=0s parsed %+v, want zero lease and cool-down, default thresholds", c)
	}
	sp, err = ParseSpec("local:max=1")
	if err != nil {
		t.Fatal(err)
	}
	if c := sp.Controller; c.MinLease != 10*time.Minute || c.CoolDown != 5*time.Minute {
		t.Errorf("defaults: %+v", c)
	}
	for _, tc := range []struct{ in, want string }{
		{"local", "max=N"},
		{"local:max=2,target=0", "thresholds"},
		{"local:max=0", "max=N"},
		{"kubernetes:max=2", "template="},
		{"k8s:max=2,template=prism-dense", "pool="},
		{"kubernetes:max=2,template=prism-dense,pool=pool=training", "priority-class="},
		{"kubernetes:max=2,template=d,pool=a=b,priority-class=c,reclaim-after=1m", "local lender"},
		{"local:max=2,pool=a=b", "kubernetes lender"},
		{"cloud:max=2", "unknown loan provider"},
		{"local:max=2,speed=3", `unknown key "speed"`},
		{"local:max=2,tick", "not KEY=VALUE"},
		{"local:max=2,tick=soon", "tick"},
		{"local:max=2,high=0.5", "thresholds"},
		{"local:max=2,startup=12m,borrow-timeout=10m", "must exceed the startup estimate"},
		{"local:max=2,capacity=NaN", `capacity: "NaN" is not a finite number`},
		{"local:max=2,capacity=+Inf", `"+Inf" is not a finite number`},
		{"local:max=2,high=Inf", `"Inf" is not a finite number`},
		// Read as their defaults, or taken negative.
		{"local:max=2,startup=0s", "startup=0s: want a positive duration"},
		{"local:max=2,borrow-timeout=0s", "borrow-timeout=0s: want a positive duration"},
		{"local:max=2,drain-timeout=0s", "drain-timeout=0s: want a positive duration"},
		{"local:max=2,window=-1s", "window=-1s: want a positive duration"},
		{"local:max=2,window=0s", "window=0s: want a positive duration"},
		{"local:max=2,grace=0s", "grace=0s: want a positive duration"},
		{"local:max=2,reclaim-after=-1s", "reclaim-after=-1s: want 0 or more"},
		{"local:max=2,hold=-1m", "hold=-1m0s: want 0 or more"},
		{"kubernetes:max=2,template=d,pool=a=b,priority-class=c,idle-refresh=0s", "idle-refresh=0s: want a positive duration"},
		// A live run forecasts from a promotion calendar only: without
		// one, predictive would borrow as reactive does, while the key
		// said otherwise.
		{"local:max=2,policy=predictive", "needs the promotion calendar"},
		{"kubernetes:max=2,template=d,pool=a=b,priority-class=c,policy=predictive", "needs the promotion calendar"},
		{"local:max=2,promo=2026-11-11T00:00:00Z/2h/3", "policy=predictive only"},
		{"local:max=2,policy=predictive,promo=2026-11-11/2h/3", "RFC 3339"},
		{"local:max=2,policy=predictive,promo=2026-11-11T00:00:00Z/2h", "START/DURATION/FACTOR"},
		{"local:max=2,policy=predictive,promo=2026-11-11T00:00:00Z/0s/3", "duration 0s must be positive"},
		{"local:max=2,policy=predictive,promo=2026-11-11T00:00:00Z/2h/NaN", "factor NaN must be a positive number"},
		{"local:max=2,policy=predictive,promo=2026-11-11T00:00:00Z/2h/-1", "factor -1 must be a positive number"},
		// Taken: the last of a key given twice won, and a malformed addr
		// failed only once the tiers had started.
		{"local:max=2,max=20", "max= is given twice"},
		{"local:max=2,tick=1s,tick=2s", "tick= is given twice"},
		{"local:max=2,addr=10xb", `addr: "10xb": want HOST:PORT`},
		{"local:max=2,addr=127.0.0.1:", `addr: "127.0.0.1:": want HOST:PORT`},
	} {
		if _, err := ParseSpec(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%q) = %v, want an error with %q", tc.in, err, tc.want)
		}
	}
}

func TestParseKubernetesSpec(t *testing.T) {
	sp, err := ParseSpec("k8s:max=4,template=prism-dense,namespace=prism,pool=pool=training,pool=gpu=h100,taint=pool=training:NoSchedule,taint=nvidia.com/gpu,priority-class=prism-loan,resource=nvidia.com/mig-3g.40gb,idle-refresh=5s,capacity=300")
	if err != nil {
		t.Fatal(err)
	}
	k := sp.Kube
	if sp.Provider != "kubernetes" || sp.Max != 4 || sp.CapacityPerWorker != 300 || k.Template != "prism-dense" || k.Namespace != "prism" ||
		strings.Join(k.Pool, " ") != "pool=training gpu=h100" || strings.Join(k.Taints, " ") != "pool=training:NoSchedule nvidia.com/gpu" ||
		k.PriorityClass != "prism-loan" || k.Resource != "nvidia.com/mig-3g.40gb" || k.IdleRefresh != 5*time.Second {
		t.Errorf("parsed %+v", sp)
	}
	sp, err = ParseSpec("kubernetes:max=1,template=d,pool=a=b,priority-class=c")
	if err != nil || sp.Kube.IdleRefresh != 10*time.Second {
		t.Errorf("default idle-refresh: %+v, %v", sp.Kube, err)
	}
}

func TestRouterDemand(t *testing.T) {
	text := func(ok, shed, fast, slow float64, inflight int) string {
		return strings.Join([]string{
			"# HELP prism_rpc_requests_total RPCs handled.",
			`prism_rpc_requests_total{code="OK",method="/prism.v1.Recommender/Recommend"} ` + ftoa(ok),
			`prism_rpc_requests_total{code="ResourceExhausted",method="/prism.v1.Recommender/Recommend"} ` + ftoa(shed),
			`prism_rpc_requests_total{code="OK",method="/prism.v1.Registry/List"} 99`,
			`prism_rpc_latency_seconds_bucket{method="/prism.v1.Recommender/Recommend",le="0.01"} ` + ftoa(fast),
			`prism_rpc_latency_seconds_bucket{method="/prism.v1.Recommender/Recommend",le="0.1"} ` + ftoa(fast+slow),
			`prism_rpc_latency_seconds_bucket{method="/prism.v1.Recommender/Recommend",le="+Inf"} ` + ftoa(fast+slow),
			"prism_router_inflight_samples " + ftoa(float64(inflight)),
		}, "\n") + "\n"
	}
	parse := func(s string) sample {
		lines, err := parseText(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return routerSample(lines)
	}
	a := parse(text(100, 0, 100, 0, 0))
	b := parse(text(290, 10, 280, 20, 64))
	d, ok := between(a, b, 2*time.Second)
	if !ok || d.offered != 100 || d.shed != 5 || d.queue != 64 || d.p99 != 100*time.Millisecond {
		t.Errorf("demand %+v, want 100 offered, 5 shed, queue 64, p99 100ms", d)
	}
	// 99% fast: the p99 is the fast bucket's bound.
	c := parse(text(1290, 10, 1270, 20, 0))
	if d, _ := between(b, c, time.Second); d.p99 != 10*time.Millisecond {
		t.Errorf("p99 %v, want 10ms", d.p99)
	}
	// A restarted router: counters back to zero, the demand unknown.
	if d, ok := between(c, a, time.Second); ok {
		t.Errorf("after a restart: %+v, known", d)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// TestParseSpecPromotions: policy=predictive with its calendar, each
// promo= an entry; Relative puts them in the controller's time.
func TestParseSpecPromotions(t *testing.T) {
	sp, err := ParseSpec("local:max=2,policy=predictive,promo=2026-11-11T00:00:00+08:00/2h/3,promo=2026-11-11T20:00:00+08:00/30m/1.5")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Controller.Policy != capacity.Predictive || len(sp.Promotions) != 2 {
		t.Fatalf("parsed %+v", sp)
	}
	origin := time.Date(2026, 11, 10, 15, 0, 0, 0, time.UTC) // 1 h before the first
	rel := Relative(sp.Promotions, origin)
	want := []capacity.Promotion{{Start: time.Hour, Duration: 2 * time.Hour, Factor: 3}, {Start: 21 * time.Hour, Duration: 30 * time.Minute, Factor: 1.5}}
	for i := range want {
		if rel[i] != want[i] {
			t.Errorf("promotion %d: %+v, want %+v", i, rel[i], want[i])
		}
	}
}

package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	dashboardSource = "helm/prism/files/prism-dashboard.json"
	dashboardCopy   = "monitoring/prism-dashboard.json"
)

// TestDashboardCopy: deploy/monitoring/prism-dashboard.json, to import
// by hand, is the chart's (make manifests copies it).
func TestDashboardCopy(t *testing.T) {
	src, err := os.ReadFile(dashboardSource)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(dashboardCopy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, cp) {
		t.Fatalf("deploy/%s differs from deploy/%s, its source: cp deploy/%s deploy/%s (make manifests does)", dashboardCopy, dashboardSource, dashboardSource, dashboardCopy)
	}
}

type dashPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// dashboardExprs are the dashboard's panels' queries, with Grafana's
// variables as Prometheus would get them.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboardSource)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string      `json:"uid"`
		Panels []dashPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardSource, err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: uid %q, %d panels", dashboardSource, d.UID, len(d.Panels))
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	out := map[string][]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], vars.Replace(tg.Expr))
		}
	}
	return out
}

// TestDashboardMetricsExist: every metric a panel reads is one a tier
// registers (or the Go client's process and runtime metrics every tier
// serves): a panel of a misspelt or removed metric stays empty, silently.
func TestDashboardMetricsExist(t *testing.T) {
	registered := registeredMetrics(t)
	for title, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			names := metricNames(e)
			if len(names) == 0 {
				t.Errorf("%q: %s names no metric", title, e)
			}
			for _, n := range names {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
				if !registered[n] && !registered[base] && !strings.HasPrefix(n, "process_") && !strings.HasPrefix(n, "go_") {
					t.Errorf("%q: metric %s is registered by no tier", title, n)
				}
			}
		}
	}
}

// TestDashboardPromtool: every panel's query parses as PromQL (each
// checked by promtool as a recording rule), when promtool is installed.
func TestDashboardPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		promtool = filepath.Join("..", ".cache", "bin", "promtool")
		if _, err := os.Stat(promtool); err != nil {
			t.Skip("promtool not found on PATH or in .cache/bin: the dashboard's queries are not parsed")
		}
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	titles := slices.Sorted(func(yield func(string) bool) {
		for k := range dashboardExprs(t) {
			if !yield(k) {
				return
			}
		}
	})
	exprs := dashboardExprs(t)
	for _, title := range titles {
		for _, e := range exprs[title] {
			rules = append(rules, rule{Record: "prism_dashboard:panel", Expr: e})
		}
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, promtool, "check", "rules", f)
}

// TestChartGrafanaDashboard: monitoring.grafanaDashboard.enabled renders
// the dashboard as a ConfigMap with the sidecar's label; off, the
// default, nothing.
func TestChartGrafanaDashboard(t *testing.T) {
	helm := helmBinary(t)
	want, err := os.ReadFile(dashboardSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		args := slices.Clone(helmTemplate)
		if on {
			args = append(args, "--set", "monitoring.grafanaDashboard.enabled=true")
		}
		var cm *corev1.ConfigMap
		for _, o := range decode(t, run(t, helm, args...)) {
			if c, ok := o.Obj.(*corev1.ConfigMap); ok && strings.HasSuffix(c.Name, "-dashboard") {
				cm = c
			}
		}
		if !on {
			if cm != nil {
				t.Errorf("grafanaDashboard off: ConfigMap %s rendered", cm.Name)
			}
			continue
		}
		if cm == nil {
			t.Fatal("grafanaDashboard on: no dashboard ConfigMap")
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("labels %v: want grafana_dashboard: \"1\"", cm.Labels)
		}
		if got := cm.Data["prism.json"]; strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
			t.Errorf("the ConfigMap's prism.json (%d bytes) is not %s (%d bytes)", len(got), dashboardSource, len(want))
		}
	}
}

// TestDashboardFleetGaugesNotSummed: the gauges each router reports of
// the same workers (every router counts every live worker, every behind
// one) are not summed over the routers: with the chart's two to four
// routers (router.autoscaling) a sum shows each worker two to four
// times. The panels take the max (one router's view) instead.
func TestDashboardFleetGaugesNotSummed(t *testing.T) {
	fleet := []string{"prism_router_model_workers", "prism_router_embedding_workers_behind", "prism_router_update_log_bytes"}
	seen := map[string]bool{}
	for title, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			for _, m := range fleet {
				if !slices.Contains(metricNames(e), m) {
					continue
				}
				seen[m] = true
				if regexp.MustCompile(`\bsum\s*(by\s*\([^)]*\)\s*)?\(\s*` + m + `\b`).MatchString(e) {
					t.Errorf("%q: %s sums %s over the routers, each of which reports every worker", title, e, m)
				}
			}
		}
	}
	for _, m := range fleet {
		if !seen[m] {
			t.Errorf("no panel reads %s", m)
		}
	}
}

package deploy

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The alerting rules: one source in the chart (files/prism-rules.yaml,
// rendered as a PrometheusRule when monitoring.prometheusRule.enabled),
// its copy for a plain Prometheus in deploy/monitoring.
const (
	rulesSource = "helm/prism/files/prism-rules.yaml"
	rulesCopy   = "monitoring/prism-rules.yaml"
	rulesTests  = "monitoring/prism-rules_test.yaml"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T, path string) ruleFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// TestRulesCopy: deploy/monitoring's rules are the chart's, byte for
// byte, so the two cannot drift.
func TestRulesCopy(t *testing.T) {
	src, err := os.ReadFile(rulesSource)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(rulesCopy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, cp) {
		t.Fatalf("deploy/%s differs from deploy/%s, its source: cp deploy/%s deploy/%s (make manifests does)", rulesCopy, rulesSource, rulesSource, rulesCopy)
	}
}

// promqlKeywords are the identifiers of PromQL that are no metric.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "offset": true, "bool": true, "inf": true, "nan": true,
}

// metricNames are the metric names expr selects: its identifiers less
// those of functions and aggregations (followed by "("), keywords, the
// label lists of by/without/on/ignoring/group_*, label matchers ({...}),
// ranges ([5m]) and string literals. A small tokenizer, enough for the
// rules here; not a PromQL parser.
func metricNames(expr string) []string {
	expr = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`).ReplaceAllString(expr, `""`)
	expr = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`).ReplaceAllString(expr, " ")
	expr = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(expr, " ")
	var out []string
	ident := regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	for _, loc := range ident.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if promqlKeywords[strings.ToLower(name)] {
			continue
		}
		if loc[0] > 0 && (expr[loc[0]-1] >= '0' && expr[loc[0]-1] <= '9' || expr[loc[0]-1] == '.') {
			continue // a number's exponent or unit: 1e3, 0.5
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`prism_a == 0`, []string{"prism_a"}},
		{`sum by (model, le) (rate(prism_a_bucket{code!~"OK|by(x)", le="0.1"}[5m])) > 1e3`, []string{"prism_a_bucket"}},
		{"sum by (reason) (rate(prism_b{reason!=\"updates\"}[5m]))\n/ ignoring (reason) group_left\nsum(rate(prism_c[5m])) > 0.01", []string{"prism_b", "prism_c"}},
		{`histogram_quantile(0.99, x) and on (model) y unless z offset 1h`, []string{"x", "y", "z"}},
		{`prism_d - time() < 7 * 86400`, []string{"prism_d"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// registeredMetrics are the metric names Prism's Go sources register:
// "prism_..." literals (prometheus.NewDesc), Namespace/Subsystem/Name
// options, and the store collector's "prism_store_"+name.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	literal := regexp.MustCompile(`"(prism_[a-z0-9_]+)"`)
	opts := regexp.MustCompile(`Namespace:\s*"prism",\s*(?:Subsystem:\s*"([a-z_]+)",\s*)?Name:\s*"([a-z0-9_]+)"`)
	storeAdd := regexp.MustCompile(`\badd\("([a-z0-9_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		for _, m := range opts.FindAllSubmatch(b, -1) {
			n := "prism_" + string(m[2])
			if len(m[1]) > 0 {
				n = "prism_" + string(m[1]) + "_" + string(m[2])
			}
			names[n] = true
		}
		if bytes.Contains(b, []byte(`"prism_store_"+name`)) {
			for _, m := range storeAdd.FindAllSubmatch(b, -1) {
				names["prism_store_"+string(m[1])] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestRulesMetricsExist: every metric an alert reads is one a tier
// registers (a histogram's _bucket, _sum and _count included): an alert
// on a misspelt or removed metric never fires, silently.
func TestRulesMetricsExist(t *testing.T) {
	registered := registeredMetrics(t)
	for _, must := range []string{"prism_router_model_requests_total", "prism_store_hot_hits_total", "prism_dense_batcher_overloaded_total"} {
		if !registered[must] {
			t.Fatalf("the source scan missed %s: fix registeredMetrics", must)
		}
	}
	rules := readRules(t, rulesSource)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			names := metricNames(r.Expr)
			if len(names) == 0 {
				t.Errorf("%s: expr names no metric:\n%s", r.Alert, r.Expr)
			}
			for _, name := range names {
				base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(name, "")
				if !registered[name] && !registered[base] {
					t.Errorf("%s: metric %s is registered by no tier", r.Alert, name)
				}
			}
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %q: want an alert name, a severity label, a summary and a description", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

// TestChartPrometheusRule: the chart renders the rules as a
// PrometheusRule, with the labels a Prometheus Operator's ruleSelector
// matches, only when monitoring.prometheusRule.enabled.
func TestChartPrometheusRule(t *testing.T) {
	helm := helmBinary(t)
	if bytes.Contains(run(t, helm, helmTemplate...), []byte("kind: PrometheusRule")) {
		t.Error("the chart renders a PrometheusRule by default; want it off unless monitoring.prometheusRule.enabled")
	}
	out := run(t, helm, append(slices.Clone(helmTemplate), "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.labels.release=kps")...)
	var found bool
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if !strings.Contains(doc, "kind: PrometheusRule") {
			continue
		}
		found = true
		var obj struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string            `json:"name"`
				Namespace string            `json:"namespace"`
				Labels    map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec ruleFile `json:"spec"`
		}
		if err := yaml.UnmarshalStrict([]byte(doc), &obj); err != nil {
			t.Fatalf("PrometheusRule: %v\n%s", err, doc)
		}
		if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Metadata.Namespace != namespace || obj.Metadata.Labels["release"] != "kps" {
			t.Errorf("PrometheusRule %s/%s %s labels %v: want monitoring.coreos.com/v1 in %s, labelled release=kps", obj.Metadata.Namespace, obj.Metadata.Name, obj.APIVersion, obj.Metadata.Labels, namespace)
		}
		if want := readRules(t, rulesSource); !reflect.DeepEqual(obj.Spec, want) {
			t.Errorf("the PrometheusRule's groups are not %s's", rulesSource)
		}
	}
	if !found {
		t.Fatalf("no PrometheusRule rendered with monitoring.prometheusRule.enabled=true:\n%s", out)
	}
}

// TestRulesPromtool checks the rules with Prometheus' own promtool and
// runs their unit tests (deploy/monitoring/prism-rules_test.yaml), when
// promtool is on PATH or in .cache/bin.
func TestRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		promtool = filepath.Join("..", ".cache", "bin", "promtool")
		if _, err := os.Stat(promtool); err != nil {
			t.Skip("promtool not found on PATH or in .cache/bin (GOBIN=$PWD/.cache/bin go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0): the rules are not checked by Prometheus")
		}
	}
	run(t, promtool, "check", "rules", rulesCopy)
	run(t, promtool, "test", "rules", rulesTests)
}

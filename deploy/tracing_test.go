package deploy

import (
	"slices"
	"strings"
	"testing"
)

// TestChartTracing: tracing.endpoint sets the OpenTelemetry environment
// on every serving container (router, embedding and dense workers, the
// dense template lent Pods copy), the protocol and sampler only when given; unset,
// none of it.
func TestChartTracing(t *testing.T) {
	helm := helmBinary(t)
	for _, c := range []struct {
		name string
		set  []string
		want map[string]string // OTEL_* name: value ("" : absent)
	}{
		{"off", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_SAMPLER": ""}},
		{"endpoint", []string{"tracing.endpoint=http://otel:4317"}, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=$(POD_NAME)", "OTEL_TRACES_SAMPLER": "", "OTEL_EXPORTER_OTLP_PROTOCOL": ""}},
		{"protocol", []string{"tracing.endpoint=http://otel:4318", "tracing.protocol=http/protobuf"}, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}},
		{"sampler", []string{"tracing.endpoint=http://otel:4317", "tracing.sampler=parentbased_traceidratio", "tracing.samplerArg=0.1"}, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}},
	} {
		args := slices.Clone(helmTemplate)
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		tiers := map[string]bool{}
		for name, p := range podSpecs(decode(t, run(t, helm, args...))) {
			for _, ctr := range p.Spec.Containers {
				if !slices.Contains(ctr.Args, "serve") && !slices.Contains(ctr.Command, "serve") && !strings.Contains(strings.Join(ctr.Command, " "), " serve ") {
					continue
				}
				for _, tier := range []string{"router", "embedding", "dense"} {
					if slices.Contains(ctr.Args, tier) || strings.Contains(strings.Join(ctr.Command, " "), "serve "+tier) {
						tiers[tier] = true
					}
				}
				env := map[string]string{}
				posName := -1
				for i, e := range ctr.Env {
					env[e.Name] = e.Value
					if e.Name == "POD_NAME" && posName < 0 {
						posName = i
					}
				}
				for k, want := range c.want {
					if got, ok := env[k]; want == "" && ok || want != "" && got != want {
						t.Errorf("%s: %s/%s: %s=%q (set: %v), want %q", c.name, name, ctr.Name, k, got, ok, want)
					}
				}
				// $(POD_NAME) expands only from a variable defined before it.
				for i, e := range ctr.Env {
					if strings.Contains(e.Value, "$(POD_NAME)") && (posName < 0 || posName > i) {
						t.Errorf("%s: %s/%s: %s reads $(POD_NAME) before it is defined", c.name, name, ctr.Name, e.Name)
					}
				}
			}
		}
		for _, tier := range []string{"router", "embedding", "dense"} {
			if !tiers[tier] {
				t.Errorf("%s: no %s container rendered", c.name, tier)
			}
		}
	}
}

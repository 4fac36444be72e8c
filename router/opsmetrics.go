package router

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-serve/prism/api/prismv1"
)

// Metrics an operator alerts on that the router's counters did not
// give: which model has no worker of a tier (prism_router_workers
// counts by role only, so a fleet of many models showed a healthy count
// while one model had no dense worker at all), and how full the queue
// of embedding updates is against --max-update-queue-bytes (only its
// refusals were counted, after the fact).

var (
	modelWorkersDesc = prometheus.NewDesc("prism_router_model_workers",
		"Live workers serving each model, by role (embedding, dense), less those a call found unreachable (left out of picks until they answer or announce again); 0 for a model some worker announced since the router started and none of that role serves now (the model is Unavailable); left out for a role whose last worker announced again without the model (retired: a model retired from both tiers is NotFound). At most 256 models are listed.",
		[]string{"model", "role"}, nil)
	updateQueueDesc = prometheus.NewDesc("prism_router_update_queue_bytes",
		"Bytes of this router's memory held by the embedding updates it took and has not answered yet (waiting for their model's turn, or being written): each one's decoded message and about 14 KiB for its call (handler stack, gRPC stream); against prism_router_update_queue_limit_bytes.",
		nil, nil)
	updateQueueLimitDesc = prometheus.NewDesc("prism_router_update_queue_limit_bytes",
		"--max-update-queue-bytes: past it, updates are refused ResourceExhausted (prism_router_rejected_total{reason=\"updates\"}).",
		nil, nil)
)

// opsCollector reports modelWorkersDesc and the update queue at each
// scrape, from the registry and the router's counters.
type opsCollector struct{ r *Router }

var _ prometheus.Collector = opsCollector{}

func (opsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- modelWorkersDesc
	ch <- updateQueueDesc
	ch <- updateQueueLimitDesc
}

func (c opsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, mw := range c.r.Reg.modelWorkers(maxModelLabels) {
		if !mw.embeddingRetired {
			ch <- prometheus.MustNewConstMetric(modelWorkersDesc, prometheus.GaugeValue, float64(mw.embedding), mw.model, "embedding")
		}
		if !mw.denseRetired {
			ch <- prometheus.MustNewConstMetric(modelWorkersDesc, prometheus.GaugeValue, float64(mw.dense), mw.model, "dense")
		}
	}
	ch <- prometheus.MustNewConstMetric(updateQueueDesc, prometheus.GaugeValue, float64(c.r.updateBytes.Load()))
	ch <- prometheus.MustNewConstMetric(updateQueueLimitDesc, prometheus.GaugeValue, float64(c.r.opts.MaxUpdateQueueBytes))
}

// modelWorkerCount is one model's live workers by role, and whether a
// role's last worker was retired (Registry.retire: the role's series is
// left out, so a model removed from one tier's plans does not page).
type modelWorkerCount struct {
	model                          string
	embedding, dense               int
	embeddingRetired, denseRetired bool
}

// modelWorkers counts the live workers of every model some worker ever
// announced (Known), the first max of them by name: the label's values
// come from workers, which are authenticated, but a fleet's models are
// bounded here all the same.
func (r *Registry) modelWorkers(max int) []modelWorkerCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	models := make([]string, 0, len(r.known))
	for m := range r.known {
		models = append(models, m)
	}
	slices.Sort(models)
	if len(models) > max {
		models = models[:max]
	}
	out := make([]modelWorkerCount, len(models))
	for i, m := range models {
		out[i].model = m
		out[i].embedding = reachable(r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, m}])
		out[i].dense = reachable(r.byModel[roleModel{prismv1.Role_ROLE_DENSE, m}])
		out[i].embeddingRetired = r.retiredPairs[roleModel{prismv1.Role_ROLE_EMBEDDING, m}]
		out[i].denseRetired = r.retiredPairs[roleModel{prismv1.Role_ROLE_DENSE, m}]
	}
	return out
}

// reachable counts the workers of s not marked unreachable (the
// registry's lock held): a worker killed stays registered until its
// probe fails, and while a restarted one announced beside it both
// counted, though the router sent the dead one nothing.
func reachable(s *workerSet) int {
	if s == nil {
		return 0
	}
	n := 0
	for _, e := range s.ws {
		if !e.unreachable {
			n++
		}
	}
	return n
}

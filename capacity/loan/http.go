package loan

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Reclaimer is a lender whose reclaims can be injected (the local one):
// POST /loan/reclaim calls it.
type Reclaimer interface {
	// Reclaim takes worker back ("": the longest-serving one) with grace
	// (<= 0: the lender's) and returns its id.
	Reclaim(worker string, grace time.Duration) (string, error)
}

// Handler serves GET /metrics (the controller's counters), GET /loan
// (Status as JSON: lent workers, the event timeline) and, when the
// provider is a Reclaimer, POST /loan/reclaim?worker=ID&grace=DURATION.
func (d *Driver) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.Collector())
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /loan", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d.Status())
	})
	mux.HandleFunc("POST /loan/reclaim", func(w http.ResponseWriter, r *http.Request) {
		rc, ok := d.o.Provider.(Reclaimer)
		if !ok {
			http.Error(w, fmt.Sprintf("the %s lender takes no injected reclaims", d.o.Provider.Name()), http.StatusNotImplemented)
			return
		}
		var grace time.Duration
		if g := r.URL.Query().Get("grace"); g != "" {
			var err error
			if grace, err = time.ParseDuration(g); err != nil {
				http.Error(w, "grace: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		id, err := rc.Reclaim(r.URL.Query().Get("worker"), grace)
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		fmt.Fprintln(w, id)
	})
	return mux
}

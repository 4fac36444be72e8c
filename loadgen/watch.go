package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Watch samples a number beside the run once a second (prism up's
// borrowed dense workers, say): it lands in the summary's time series,
// timeseries.csv and the plot.
type Watch struct {
	// Name labels it ("borrowed workers").
	Name string
	// Read returns its value now.
	Read func(ctx context.Context) (float64, error)
}

// ProbeURL checks, before a run, that url answers a GET with 200 OK: a
// wrong --watch-borrowed port or path is refused at once, not found
// in the report after the run. It does not ask for the metric itself:
// a controller that has borrowed nothing yet may not export it.
// tlsClient is as GaugeWatch's.
func ProbeURL(ctx context.Context, url string, tlsClient *tls.Config) error {
	client := watchClient(tlsClient)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// GaugeWatch reads the sum of metric's samples from a Prometheus /metrics
// URL (prism_capacity_borrowed_workers from prism up --loan's endpoint),
// no server linked. tlsClient, when set, is the TLS configuration an
// https URL is read with (prism up's controller serves HTTPS under TLS).
func GaugeWatch(name, url, metric string, tlsClient *tls.Config) *Watch {
	client := watchClient(tlsClient)
	return &Watch{Name: name, Read: func(ctx context.Context) (float64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("watch %s: %s", url, resp.Status)
		}
		sum, found := 0.0, false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			rest, ok := strings.CutPrefix(line, metric)
			if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
				continue
			}
			f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
			if len(f) > 0 {
				if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					sum, found = sum+v, true
				}
			}
		}
		if err := sc.Err(); err != nil {
			return 0, fmt.Errorf("watch %s: %w", url, err)
		}
		if !found {
			// Read as 0, a wrong URL's page looked like nothing borrowed.
			return 0, fmt.Errorf("watch %s: no %s in it", url, metric)
		}
		return sum, nil
	}}
}

// watchLoop samples w at each second of the run into vals (NaN when a
// read fails, the first failure's error in *firstErr) until ctx ends.
func watchLoop(ctx context.Context, w *Watch, clock Clock, start time.Time, vals *[]float64, firstErr *error, done chan<- struct{}) {
	defer close(done)
	for i := 0; ; i++ {
		if d := start.Add(time.Duration(i) * time.Second).Sub(clock.Now()); d > 0 {
			clock.Sleep(ctx, d)
		}
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
		v, err := w.Read(rctx)
		cancel()
		if err != nil {
			v = nan
			if *firstErr == nil && ctx.Err() == nil {
				*firstErr = err
			}
		}
		*vals = append(*vals, v)
	}
}

// watchClient is the HTTP client of a watch: a 2 s timeout, and
// tlsClient (nil: Go's defaults) for an https URL.
func watchClient(tlsClient *tls.Config) *http.Client {
	client := &http.Client{Timeout: 2 * time.Second}
	if tlsClient != nil {
		client.Transport = &http.Transport{TLSClientConfig: tlsClient}
	}
	return client
}

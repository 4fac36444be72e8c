package loan

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// EveryAddress turns a /metrics URL whose host is a name into one URL
// per address the name resolves to, comma-separated (Options.RouterMetrics
// sums them): the routers behind a headless Service
// (http://prism-router-headless:9090/metrics) are scraped one by one. An
// IP, an unresolvable name or a bad URL is returned as it is.
func EveryAddress(ctx context.Context, raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	host, port := u.Hostname(), u.Port()
	if net.ParseIP(host) != nil {
		return raw
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil || len(addrs) == 0 {
		return raw
	}
	slices.Sort(addrs)
	out := make([]string, len(addrs))
	for i, a := range addrs {
		v := *u
		v.Host = a
		if port != "" {
			v.Host = net.JoinHostPort(a, port)
		} else if strings.Contains(a, ":") {
			v.Host = "[" + a + "]"
		}
		out[i] = v.String()
	}
	return strings.Join(out, ",")
}

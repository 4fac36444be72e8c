package serve

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// TestAdvertise: the address a worker announces, for each listen
// address and --advertise-addr; never an unspecified host.
func TestAdvertise(t *testing.T) {
	routes := map[string]string{ // router -> local address routing to it
		"10.77.0.2:7000":   "10.77.0.5",
		"[fd00::2]:7000":   "fd00::5",
		"127.0.0.1:7000":   "127.0.0.1",
		"router.prism:443": "192.168.3.4",
	}
	localFor := func(r string) (net.IP, error) {
		if ip, ok := routes[r]; ok {
			return net.ParseIP(ip), nil
		}
		return nil, errors.New("no route to " + r)
	}
	ifaces := func() ([]net.IP, error) {
		return []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("fe80::1"), net.ParseIP("fd00::9"), net.ParseIP("172.16.0.9")}, nil
	}
	for _, tc := range []struct {
		name, flag, listen, bound string
		routers                   []string
		want, err                 string
	}{
		{name: "specific IPv4 host", listen: "10.77.0.5:0", bound: "10.77.0.5:41000", routers: []string{"10.77.0.2:7000"}, want: "10.77.0.5:41000"},
		{name: "loopback", listen: "127.0.0.1:0", bound: "127.0.0.1:41000", want: "127.0.0.1:41000"},
		{name: "specific name", listen: "worker-3.prism:7100", bound: "10.1.2.3:7100", want: "worker-3.prism:7100"},
		{name: "specific name, port 0", listen: "worker-3.prism:0", bound: "10.1.2.3:41000", want: "worker-3.prism:41000"},
		{name: "empty host: route to the router", listen: ":0", bound: "[::]:41000", routers: []string{"10.77.0.2:7000"}, want: "10.77.0.5:41000"},
		{name: "0.0.0.0: route to the router", listen: "0.0.0.0:7100", bound: "0.0.0.0:7100", routers: []string{"10.77.0.2:7000"}, want: "10.77.0.5:7100"},
		{name: "[::]: route to the router", listen: "[::]:0", bound: "[::]:41000", routers: []string{"[fd00::2]:7000"}, want: "[fd00::5]:41000"},
		{name: "router on this host", listen: ":0", bound: "[::]:41000", routers: []string{"127.0.0.1:7000"}, want: "127.0.0.1:41000"},
		{name: "router by name", listen: ":0", bound: "[::]:41000", routers: []string{"router.prism:443"}, want: "192.168.3.4:41000"},
		{name: "first router that routes", listen: ":0", bound: "[::]:41000", routers: []string{"gone:1", "10.77.0.2:7000"}, want: "10.77.0.5:41000"},
		{name: "0.0.0.0 bound IPv4-only takes no IPv6 route", listen: "0.0.0.0:0", bound: "0.0.0.0:41000", routers: []string{"[fd00::2]:7000"}, want: "172.16.0.9:41000"},
		{name: "0.0.0.0 bound dual-stack takes an IPv6 route", listen: "0.0.0.0:0", bound: "[::]:41000", routers: []string{"[fd00::2]:7000"}, want: "[fd00::5]:41000"},
		{name: "no router: an interface, IPv4 first", listen: ":0", bound: "[::]:41000", want: "172.16.0.9:41000"},
		{name: "no route: an interface", listen: ":0", bound: "[::]:41000", routers: []string{"gone:1"}, want: "172.16.0.9:41000"},
		{name: "flag", flag: "203.0.113.7:9000", listen: ":0", bound: "[::]:41000", routers: []string{"10.77.0.2:7000"}, want: "203.0.113.7:9000"},
		{name: "flag without port", flag: "203.0.113.7", listen: ":0", bound: "[::]:41000", want: "203.0.113.7:41000"},
		{name: "flag IPv6 without port", flag: "fd00::7", listen: ":0", bound: "[::]:41000", want: "[fd00::7]:41000"},
		{name: "flag name, port 0", flag: "dense-0.prism:0", listen: "127.0.0.1:0", bound: "127.0.0.1:41000", want: "dense-0.prism:41000"},
		{name: "flag unspecified", flag: "0.0.0.0:9000", listen: ":0", bound: "[::]:41000", err: "unspecified"},
		{name: "flag [::]", flag: "[::]:9000", listen: ":0", bound: "[::]:41000", err: "unspecified"},
		{name: "flag port only", flag: ":9000", listen: ":0", bound: "[::]:41000", err: "unspecified"},
		{name: "bufconn", listen: "", bound: "bufconn", want: "bufconn"},
		// An IPv6 address with a port, unbracketed, was taken for an
		// address alone (fd00::5:8600 is one) and announced with the
		// bound port: refused where the text also reads as an address
		// and a port, saying how to write either.
		{name: "flag IPv6 and port unbracketed", flag: "fd00::5:8600", listen: ":0", bound: "[::]:41000", err: "[fd00::5]:8600 (or [fd00::5:8600] for that address alone)"},
		{name: "flag full IPv6 and port unbracketed", flag: "2001:db8:0:0:0:0:0:5:8600", listen: ":0", bound: "[::]:41000", err: "[2001:db8:0:0:0:0:0:5]:8600"},
		{name: "flag IPv6 bracketed, without port", flag: "[fd00::5:8600]", listen: ":0", bound: "[::]:41000", want: "[fd00::5:8600]:41000"},
		{name: "flag IPv6 bracketed, with port", flag: "[fd00::5]:8600", listen: ":0", bound: "[::]:41000", want: "[fd00::5]:8600"},
		{name: "flag IPv6 ending in ::", flag: "fd00::", listen: ":0", bound: "[::]:41000", want: "[fd00::]:41000"},
		{name: "flag neither host nor address", flag: "worker:3:4", listen: ":0", bound: "[::]:41000", err: "not an IP address or a host name"},
		// A zone names an interface of this host, which a router on
		// another host cannot dial: it was announced as it was.
		{name: "flag zoned", flag: "[fe80::1%eth0]:8600", listen: ":0", bound: "[::]:41000", err: "zone"},
		{name: "flag zoned without port", flag: "fe80::1%eth0", listen: ":0", bound: "[::]:41000", err: "zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Advertise{Flag: tc.flag, Listen: tc.listen, Bound: tc.bound, Routers: tc.routers, LocalFor: localFor, Interfaces: ifaces}.Addr()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// Nothing at all to advertise: an error, not [::]:port.
	_, err := Advertise{Listen: ":0", Bound: "[::]:41000", LocalFor: localFor, Interfaces: func() ([]net.IP, error) { return []net.IP{net.ParseIP("127.0.0.1")}, nil }}.Addr()
	if err == nil {
		t.Error("no routable address: no error")
	}
}

// TestAdvertiseIPv4WildcardIPv6Router: a worker listening on
// 0.0.0.0:PORT (Go's socket takes both families) whose router is at an
// IPv6 address, on a host with no global address (an IPv6-only pod has
// none of IPv4), announces the IPv6 address that routes to the router,
// and the router reaches it there. It failed with "no address to
// advertise" (the worker exited), 0.0.0.0 taken as IPv4 only.
func TestAdvertiseIPv4WildcardIPv6Router(t *testing.T) {
	lis, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if c, err := net.Dial("tcp", net.JoinHostPort("::1", portOf(t, lis.Addr().String()))); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		c.Close()
	}
	got, err := Advertise{Listen: "0.0.0.0:0", Bound: lis.Addr().String(), Routers: []string{"[::1]:7000"},
		Interfaces: func() ([]net.IP, error) { return nil, nil }}.Addr()
	if want := net.JoinHostPort("::1", portOf(t, lis.Addr().String())); err != nil || got != want {
		t.Fatalf("advertised %q, %v; want %q", got, err, want)
	}
	c, err := net.Dial("tcp", got)
	if err != nil {
		t.Fatalf("dial the advertised %s: %v", got, err)
	}
	c.Close()
	// Nothing to advertise says so, without a %!w(<nil>) for the
	// routers' errors it has none of.
	_, err = Advertise{Listen: "0.0.0.0:0", Bound: lis.Addr().String(), Interfaces: func() ([]net.IP, error) { return nil, nil }}.Addr()
	if err == nil || strings.Contains(err.Error(), "%!") {
		t.Fatalf("no router, no interface: %v", err)
	}
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRouteTo: the real routing lookup answers the loopback address for
// a router on this host.
func TestRouteTo(t *testing.T) {
	ip, err := routeTo("127.0.0.1:7000")
	if err != nil || !ip.IsLoopback() {
		t.Fatalf("routeTo(127.0.0.1:7000) = %v, %v", ip, err)
	}
	got, err := Advertise{Listen: ":0", Bound: "[::]:41000", Routers: []string{"127.0.0.1:7000"}}.Addr()
	if err != nil || got != "127.0.0.1:41000" {
		t.Fatalf("advertised %q, %v; want 127.0.0.1:41000", got, err)
	}
}

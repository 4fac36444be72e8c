package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Advertise chooses the address a worker announces to the routers: the
// one the routers and the other workers dial, so never an unspecified
// host such as [::]:port, which no other host can reach.
//
//   - Flag set (--advertise-addr): that address; HOST alone, or port 0,
//     takes the bound port.
//   - The listen host is specific (an IP or a name): that host with the
//     bound port.
//   - The listen host is unspecified (":port", "0.0.0.0", "[::]"): the
//     local address of the interface that routes to the first router
//     that resolves (a UDP "connect", which sends nothing), else the
//     first global unicast address of an interface, with the bound port.
type Advertise struct {
	// Flag is the address asked for, "" to choose one.
	Flag string
	// Listen is the listen address asked for (--addr).
	Listen string
	// Bound is the address the listener got (it knows the port).
	Bound string
	// Routers are the routers' addresses, HOST:PORT.
	Routers []string
	// LocalFor, when set, replaces the routing lookup: the local address
	// the kernel would send from to router (tests).
	LocalFor func(router string) (net.IP, error)
	// Interfaces, when set, replaces the interfaces' addresses (tests).
	Interfaces func() ([]net.IP, error)
}

// Addr is the address to announce.
func (a Advertise) Addr() (string, error) {
	bhost, bport, err := net.SplitHostPort(a.Bound)
	if err != nil {
		// Not a TCP address (bufconn): announce it as it is.
		return a.Bound, nil
	}
	if a.Flag != "" {
		host, port, err := net.SplitHostPort(a.Flag)
		if err != nil {
			// HOST alone ("10.0.0.7", "worker-3", "fd00::7", "[fd00::7]").
			host, port = strings.Trim(a.Flag, "[]"), ""
			if !strings.HasPrefix(a.Flag, "[") {
				if err := portInIPv6(a.Flag); err != nil {
					return "", fmt.Errorf("advertise address %q: %w", a.Flag, err)
				}
			}
		}
		if host == "" || unspecified(host) {
			return "", fmt.Errorf("advertise address %q: the host must be one other hosts can dial, not an unspecified one", a.Flag)
		}
		if _, zone, ok := strings.Cut(host, "%"); ok {
			return "", fmt.Errorf("advertise address %q: its zone (%%%s) names an interface of this host, which a router on another host cannot dial: advertise a global address or a name", a.Flag, zone)
		}
		if strings.Contains(host, ":") && net.ParseIP(host) == nil {
			return "", fmt.Errorf("advertise address %q: %q is not an IP address or a host name", a.Flag, host)
		}
		if port == "" || port == "0" {
			port = bport
		}
		return net.JoinHostPort(host, port), nil
	}
	lhost := bhost
	if h, _, err := net.SplitHostPort(a.Listen); err == nil {
		lhost = h
	}
	if lhost != "" && !unspecified(lhost) {
		if net.ParseIP(lhost) != nil {
			return a.Bound, nil
		}
		return net.JoinHostPort(lhost, bport), nil
	}
	// Listening on every interface: the one facing the routers. Go
	// listens on both families for 0.0.0.0 as for [::] (one IPv6 socket
	// taking IPv4-mapped connections too, bound as [::]:port): an IPv6
	// address is as good, and on an IPv6-only host the only one. Only a
	// socket bound as 0.0.0.0 (a kernel without IPv6) takes IPv4 only.
	v4only := bhost == "0.0.0.0"
	localFor := a.LocalFor
	if localFor == nil {
		localFor = routeTo
	}
	var errs []error
	for _, r := range a.Routers {
		ip, err := localFor(r)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ip == nil || ip.IsUnspecified() || (v4only && ip.To4() == nil):
		default:
			return net.JoinHostPort(ip.String(), bport), nil
		}
	}
	ifaces := a.Interfaces
	if ifaces == nil {
		ifaces = interfaceIPs
	}
	ips, err := ifaces()
	if err != nil {
		errs = append(errs, err)
	}
	var pick net.IP
	for _, ip := range ips {
		if !ip.IsGlobalUnicast() || (v4only && ip.To4() == nil) {
			continue
		}
		if pick == nil || (pick.To4() == nil && ip.To4() != nil) {
			pick = ip // IPv4 first
		}
	}
	if pick != nil {
		return net.JoinHostPort(pick.String(), bport), nil
	}
	why := fmt.Sprintf("no address to advertise for %s: no router address routes from this host and no interface has a global address", a.Bound)
	if len(errs) == 0 {
		return "", errors.New(why)
	}
	return "", fmt.Errorf("%s: %w", why, errors.Join(errs...))
}

// portInIPv6 refuses an unbracketed address that reads as an IPv6
// address followed by a port (fd00::5:8600: fd00::5 and 8600), which
// the HOST alone form took for one address (fd00::5:8600 is one too) and
// announced with the bound port. One that does not read so (fd00::5,
// fd00::) is an address alone.
func portInIPv6(s string) error {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return nil
	}
	host, port := s[:i], s[i+1:]
	if !strings.Contains(host, ":") || net.ParseIP(host) == nil {
		return nil
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil
	}
	return fmt.Errorf("an IPv6 address with a port is written in brackets, [%s]:%s (or [%s] for that address alone)", host, port, s)
}

// unspecified says whether host is "", 0.0.0.0 or :: (every interface).
func unspecified(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// routeTo is the local address this host sends from to router (its
// first address that routes): a UDP socket "connected" to it, which
// sends no packet.
func routeTo(router string) (net.IP, error) {
	host, port, err := net.SplitHostPort(router)
	if err != nil {
		return nil, fmt.Errorf("router address %q: %w", router, err)
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if ips, err = net.DefaultResolver.LookupHost(ctx, host); err != nil {
			return nil, fmt.Errorf("resolve router %q: %w", host, err)
		}
	}
	var errs []error
	for _, ip := range ips {
		c, err := net.Dial("udp", net.JoinHostPort(ip, port))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		local := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		return local, nil
	}
	return nil, fmt.Errorf("route to router %q: %w", router, errors.Join(errs...))
}

// interfaceIPs are the addresses of the interfaces that are up.
func interfaceIPs() ([]net.IP, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				out = append(out, n.IP)
			}
		}
	}
	return out, nil
}

// Package netns builds throwaway multi-host networks on one Linux machine
// for tests: each "host" is a network namespace with its own address,
// joined to the others by a veth pair on a bridge (in a namespace of its
// own, so the machine's firewall and bridges play no part), with one
// more veth giving the root namespace an address on the same /24. Names
// are unique per run and the /24 is one no interface or route of the
// machine uses, so a stale run's leftovers do not collide. Everything
// needs root (CAP_NET_ADMIN) and the ip command (iproute2).
package netns

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// Topology is a bridge and the hosts on it.
type Topology struct {
	// Prefix starts every name this topology made (namespaces, the root
	// namespace's veth).
	Prefix string
	// Subnet is the /24's first three octets ("10.77.42").
	Subnet string
	// Switch is the namespace holding the bridge.
	Switch string
	// RootAddr is the root namespace's address on the bridge (Subnet.1).
	RootAddr string
	// Hosts are the hosts, Subnet.2 on.
	Hosts []*Host
	// rootDev is the root namespace's end of its veth.
	rootDev string
	made    []string // namespaces made, for Close
}

// Host is one network namespace on the bridge.
type Host struct {
	// Name is the namespace (ip netns exec NAME ...).
	Name string
	// Addr is its IPv4 address on the bridge.
	Addr string
	// port is its veth's end on the bridge, in the switch namespace: the
	// "cable" SetLink pulls.
	port string
}

// ip runs the ip command.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Available says why namespaces cannot be made here (nil: they can): not
// root, no ip command, or the kernel refusing. It makes and removes one.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("the ip command (iproute2) is not installed")
	}
	name := "prismprobe" + randHex(4)
	if err := ip("netns", "add", name); err != nil {
		return err
	}
	return ip("netns", "del", name)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// New makes n hosts on a bridge in 10.77.X.0/24, X chosen among the /24s
// nothing on the machine uses. On an error it removes what it made.
func New(n int) (*Topology, error) {
	// One topology is made at a time in a process: freeSubnet checks the
	// routes, and the subnet shows in them only once build has added
	// the root address, so two made at once (tests in parallel) could
	// pick the same /24.
	building.Lock()
	defer building.Unlock()
	t := &Topology{Prefix: "pm" + randHex(3)}
	subnet, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	t.Subnet, t.RootAddr, t.Switch = subnet, subnet+".1", t.Prefix+"-sw"
	if err := t.build(n); err != nil {
		if cerr := t.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return t, nil
}

// building serializes New's choice of a subnet and its use.
var building sync.Mutex

func (t *Topology) build(n int) error {
	if err := t.addNS(t.Switch); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", t.Switch, "link", "set", "lo", "up"},
		{"-n", t.Switch, "link", "add", "br0", "type", "bridge"},
		{"-n", t.Switch, "link", "set", "br0", "up"},
	}
	// The root namespace's veth: its end there is the only name made
	// outside the topology's namespaces.
	t.rootDev = t.Prefix + "r"
	steps = append(steps,
		[]string{"link", "add", t.rootDev, "type", "veth", "peer", "name", "root", "netns", t.Switch},
		[]string{"-n", t.Switch, "link", "set", "root", "master", "br0", "up"},
		[]string{"addr", "add", t.RootAddr + "/24", "dev", t.rootDev},
		[]string{"link", "set", t.rootDev, "up"},
	)
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	for i := range n {
		h := &Host{Name: fmt.Sprintf("%s-h%d", t.Prefix, i), Addr: fmt.Sprintf("%s.%d", t.Subnet, i+2), port: fmt.Sprintf("p%d", i)}
		if err := t.addNS(h.Name); err != nil {
			return err
		}
		t.Hosts = append(t.Hosts, h)
		for _, s := range [][]string{
			{"-n", h.Name, "link", "set", "lo", "up"},
			{"-n", t.Switch, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.Name},
			{"-n", t.Switch, "link", "set", h.port, "master", "br0", "up"},
			{"-n", h.Name, "addr", "add", h.Addr + "/24", "dev", "eth0"},
			{"-n", h.Name, "link", "set", "eth0", "up"},
		} {
			if err := ip(s...); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *Topology) addNS(name string) error {
	if err := ip("netns", "add", name); err != nil {
		return err
	}
	t.made = append(t.made, name)
	return nil
}

// freeSubnet picks 10.77.X (X in 1..254) that no address or route of
// the root namespace falls in.
func freeSubnet() (string, error) {
	for range 20 {
		x, err := rand.Int(rand.Reader, big.NewInt(254))
		if err != nil {
			return "", err
		}
		s := fmt.Sprintf("10.77.%d", x.Int64()+1)
		out, err := exec.Command("ip", "-4", "route", "show", "table", "all", "to", "root", s+".0/24").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("ip route show: %w: %s", err, out)
		}
		used := strings.TrimSpace(string(out)) != ""
		if !used {
			out, err = exec.Command("ip", "-4", "route", "show", "table", "all", "to", "match", s+".1").CombinedOutput()
			if err != nil {
				return "", fmt.Errorf("ip route show: %w: %s", err, out)
			}
			// Only the default route may cover it.
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if l != "" && !strings.HasPrefix(l, "default") {
					used = true
				}
			}
		}
		if !used {
			return s, nil
		}
	}
	return "", errors.New("no free /24 in 10.77.0.0/16")
}

// Command is name args run in host's namespace (ip netns exec, which
// execs: the process's id is the command's).
func (t *Topology) Command(h *Host, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// SetLink takes host's link to the bridge down (a pulled cable: the
// host and its processes stay, nothing reaches them) or up again.
func (t *Topology) SetLink(h *Host, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ip("-n", t.Switch, "link", "set", h.port, state)
}

// Close removes everything the topology made; the processes still in a
// namespace keep it alive (unnamed) until they exit, so stop them first.
func (t *Topology) Close() error {
	var errs []error
	if t.rootDev != "" {
		// Gone already when the switch namespace went first; deleting
		// one end of a veth deletes both.
		if err := exec.Command("ip", "link", "show", t.rootDev).Run(); err == nil {
			errs = append(errs, ip("link", "del", t.rootDev))
		}
	}
	for i := len(t.made) - 1; i >= 0; i-- {
		errs = append(errs, ip("netns", "del", t.made[i]))
	}
	t.made = nil
	return errors.Join(errs...)
}

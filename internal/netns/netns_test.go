package netns

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary, run in a namespace, a tiny TCP echo
// server ("listen ADDR") or client ("dial ADDR"): the namespace's own
// sockets, with no tool beyond ip.
const helperEnv = "PRISM_NETNS_HELPER"

func TestHelperProcess(t *testing.T) {
	mode, addr, ok := strings.Cut(os.Getenv(helperEnv), " ")
	if !ok {
		t.Skip("a helper run in a namespace by TestTopology")
	}
	switch mode {
	case "listen":
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("listening on", l.Addr())
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprint(c, "echo "+line)
			}()
		}
	case "dial":
		got, err := echo(addr)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Print(got)
		os.Exit(0)
	}
}

func echo(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprint(c, "hello\n")
	return bufio.NewReader(c).ReadString('\n')
}

// TestTopology: two hosts and the root namespace reach each other over
// the bridge; a host whose link is down is unreachable, and reachable
// again once it is up; Close leaves nothing behind.
func TestTopology(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("helper run")
	}
	if err := Available(); err != nil {
		t.Skipf("cannot make network namespaces here (%v): skipping", err)
	}
	topo, err := New(2)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			topo.Close()
		}
	})
	h0, h1 := topo.Hosts[0], topo.Hosts[1]
	if !strings.HasPrefix(h0.Addr, topo.Subnet+".") || h0.Addr == h1.Addr || topo.RootAddr != topo.Subnet+".1" {
		t.Fatalf("addresses: root %s, hosts %s %s in %s", topo.RootAddr, h0.Addr, h1.Addr, topo.Subnet)
	}
	addr := net.JoinHostPort(h0.Addr, "7070")
	srv := topo.Command(h0, os.Args[0], "-test.run=^TestHelperProcess$")
	srv.Env = append(os.Environ(), helperEnv+"=listen "+addr)
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "listening on") {
		t.Fatalf("listener in %s: %q %v", h0.Name, line, err)
	}
	fromHost := func() (string, error) {
		c := topo.Command(h1, os.Args[0], "-test.run=^TestHelperProcess$")
		c.Env = append(os.Environ(), helperEnv+"=dial "+addr)
		b, err := c.Output()
		return string(b), err
	}
	if got, err := echo(addr); err != nil || got != "echo hello\n" {
		t.Fatalf("root namespace to %s: %q %v", addr, got, err)
	}
	if got, err := fromHost(); err != nil || got != "echo hello\n" {
		t.Fatalf("%s to %s: %q %v", h1.Name, addr, got, err)
	}

	if err := topo.SetLink(h0, false); err != nil {
		t.Fatal(err)
	}
	if got, err := echo(addr); err == nil {
		t.Fatalf("link down, yet %q", got)
	}
	if err := topo.SetLink(h0, true); err != nil {
		t.Fatal(err)
	}
	var got string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, err = echo(addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || got != "echo hello\n" {
		t.Fatalf("link up again: %q %v", got, err)
	}

	srv.Process.Kill()
	srv.Wait()
	closed = true
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := exec.Command("ip", "netns", "list").Output()
	links, _ := exec.Command("ip", "link", "show").Output()
	if strings.Contains(string(names), topo.Prefix) || strings.Contains(string(links), topo.Prefix) {
		t.Errorf("left behind after Close:\n%s\n%s", names, links)
	}
}

package router

import (
	"context"
	"testing"

	"google.golang.org/grpc/connectivity"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestCloseClosesRetiredConns: Close closes the connections dropConns
// retired (their worker left) and the one to a sequencer that moved, not
// only the live ones: the retired ones, each with its goroutines, were
// left running for DefaultTimeout+5s (35 s by default) after Close.
func TestCloseClosesRetiredConns(t *testing.T) {
	cn := &fakeCN{}
	r := newRouter(t, Options{}, cn)
	ws, _ := r.Reg.List(context.Background(), nil)
	var addr, id string
	for _, w := range ws.GetWorkers() {
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			addr, id = w.GetAddr(), w.GetId()
		}
	}
	worker, err := r.conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	seqA, err := r.sequencerConn("passthrough:///seq-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.sequencerConn("passthrough:///seq-b"); err != nil { // the sequencer moved
		t.Fatal(err)
	}
	if _, err := r.Reg.Leave(context.Background(), &prismv1.LeaveRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	r.dropConns()
	if st := worker.GetState(); st == connectivity.Shutdown {
		t.Fatal("the retired connection was closed at once, under the calls that may still run on it")
	}
	r.Close()
	if st := worker.GetState(); st != connectivity.Shutdown {
		t.Errorf("after Close, the connection to the worker that left is %v, want SHUTDOWN", st)
	}
	if st := seqA.GetState(); st != connectivity.Shutdown {
		t.Errorf("after Close, the connection to the sequencer that moved is %v, want SHUTDOWN", st)
	}
}

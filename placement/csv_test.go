package placement

import (
	"strings"
	"testing"
)

func TestReadTasksCSVErrors(t *testing.T) {
	head := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
	cases := []struct{ in, want string }{
		{"", "t.csv: empty file"},
		{"name,cpu_milli\n", `t.csv:1: missing column "memory_mib"`},
		{head + "a,1000,10,1,500,\nb,x,10,1,500,\n", `t.csv:3: column "cpu_milli": "x" is not an integer`},
		{head + "a,1000,10,2,500,\n", `t.csv:2: task "a": 2 gpus must be whole gpus`},
		{head + "a,1000,10,1,1500,\n", `t.csv:2: task "a": gpu_milli 1500 out of range`},
		{head + "a,-5,10,0,0,\n", `t.csv:2: column "cpu_milli": negative value -5`},
		{head + "a,1000,10,1,500,\"V100\n", `t.csv:2:`},
		{head, "t.csv: no tasks"},
	}
	for _, c := range cases {
		_, err := ReadTasksCSV("t.csv", strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("input %q: error %v, want containing %q", c.in, err, c.want)
		}
	}
}

func TestReadCSVOK(t *testing.T) {
	tasks, err := ReadTasksCSV("t.csv", strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\na,1000,10,1,500,V100M16|V100M32,LS\nb,2000,0,0,0,,BE\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || len(tasks[0].Models) != 2 || !tasks[0].Accepts("V100M32") || tasks[0].Accepts("T4") || !tasks[1].Accepts("T4") {
		t.Fatalf("tasks %+v", tasks)
	}
	nodes, err := ReadNodesCSV("n.csv", strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nx,96000,1024,8,G2\n"))
	if err != nil || len(nodes) != 1 || nodes[0].GPUs != 8 {
		t.Fatalf("nodes %+v, %v", nodes, err)
	}
	if _, err := ReadNodesCSV("n.csv", strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nx,96000,1024,99,G2\n")); err == nil || !strings.Contains(err.Error(), "n.csv:2:") {
		t.Fatalf("too many gpus: %v", err)
	}
}

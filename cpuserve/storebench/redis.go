package storebench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoRedis is returned when redis-server is not installed.
var ErrNoRedis = fmt.Errorf("redis-server not found on PATH")

// Redis is a redis-server started on a loopback port for a benchmark.
type Redis struct {
	cmd    *exec.Cmd
	Client *redis.Client
	dir    string
}

// StartRedis starts redis-server (no persistence) on a free loopback
// port; ErrNoRedis when it is not installed.
func StartRedis() (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedis
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "prism-redis")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no")
	// Killed with this process: a benchmark stopped by a signal (a
	// script's timeout, kill) runs no Close.
	cmd.SysProcAttr = dieWithParent()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	r := &Redis{cmd: cmd, dir: dir, Client: redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 4})}
	for i := 0; ; i++ {
		if err := r.Client.Ping(context.Background()).Err(); err == nil {
			return r, nil
		} else if i > 100 {
			r.Close()
			return nil, fmt.Errorf("redis-server did not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CPU is the server's CPU time so far (user and system, all its
// threads); 0 where /proc does not say.
func (r *Redis) CPU() time.Duration {
	d, _ := processCPU(r.cmd.Process.Pid)
	return d
}

// Close stops the server.
func (r *Redis) Close() {
	r.Client.Close()
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	os.RemoveAll(r.dir)
}

func redisKey(table int, id int64) string {
	var b [12]byte
	binary.BigEndian.PutUint32(b[:4], uint32(table))
	binary.BigEndian.PutUint64(b[4:], uint64(id))
	return string(b[:])
}

// LoadRedis writes the rows the batches touch, as raw little-endian
// float32 values, with pipelined MSETs.
func (e *Env) LoadRedis(r *Redis, batches [][][]int64) (int, error) {
	ctx := context.Background()
	seen := make([]map[int64]bool, len(e.Tables))
	for k := range seen {
		seen[k] = map[int64]bool{}
	}
	var kv []any
	n := 0
	flush := func() error {
		if len(kv) == 0 {
			return nil
		}
		err := r.Client.MSet(ctx, kv...).Err()
		kv = kv[:0]
		return err
	}
	dim := e.Dim
	for _, b := range batches {
		for k, ids := range b {
			for _, id := range ids {
				if seen[k][id] {
					continue
				}
				seen[k][id] = true
				row := e.Tables[k][id*int64(dim) : (id+1)*int64(dim)]
				val := make([]byte, 4*dim)
				for i, x := range row {
					binary.LittleEndian.PutUint32(val[4*i:], math.Float32bits(x))
				}
				kv = append(kv, redisKey(k, id), val)
				n++
				if len(kv) >= 2000 {
					if err := flush(); err != nil {
						return n, err
					}
				}
			}
		}
	}
	return n, flush()
}

// RedisLookup fetches each batch with one MGET per table, pipelined (one
// round trip per batch), and decodes the rows into per-table outputs.
func (e *Env) RedisLookup(r *Redis, batches [][][]int64) (Result, error) {
	ctx := context.Background()
	dim := e.Dim
	out := make([][]float32, len(e.Tables))
	for k := range out {
		out[k] = make([]float32, e.Cfg.Batch*dim)
	}
	keys := make([][]string, len(e.Tables))
	res := Result{Name: "redis (MGET per table, 1 round trip/batch)"}
	start := time.Now()
	for _, b := range batches {
		t0 := time.Now()
		cmds, err := r.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, ids := range b {
				keys[k] = keys[k][:0]
				for _, id := range ids {
					keys[k] = append(keys[k], redisKey(k, id))
				}
				p.MGet(ctx, keys[k]...)
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		for k, c := range cmds {
			vals := c.(*redis.SliceCmd).Val()
			o := out[k]
			for i, v := range vals {
				s, ok := v.(string)
				if !ok || len(s) != 4*dim {
					return res, fmt.Errorf("redis: table %d id %d missing", k, b[k][i])
				}
				for j := range dim {
					o[i*dim+j] = math.Float32frombits(binary.LittleEndian.Uint32([]byte(s[4*j : 4*j+4])))
				}
			}
			res.Rows += int64(len(vals))
		}
		res.Latencies = append(res.Latencies, time.Since(t0))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

func runRedis(w io.Writer, e *Env) error {
	r, err := StartRedis()
	if err == ErrNoRedis {
		fmt.Fprintln(w, "redis: skipped (redis-server not installed; apt-get install -y redis-server)")
		return nil
	}
	if err != nil {
		return err
	}
	defer r.Close()
	warm, err := e.Batches(e.Cfg.warmup(), e.Cfg.Zipf, 1)
	if err != nil {
		return err
	}
	batches, err := e.Batches(e.Cfg.Batches, e.Cfg.Zipf, 2)
	if err != nil {
		return err
	}
	n, err := e.LoadRedis(r, append(warm, batches...))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "redis: loaded %d rows\n", n)
	if _, err := e.StoreLookup("warmup", warm); err != nil {
		return err
	}
	// Two store passes, each interleaved with Redis: fresh batches (ids
	// the store has not seen go to Pebble, while Redis holds every row
	// the batches touch), then the same batches again (the rows the hot
	// tier admitted are resident: its hit ratio says whether that is
	// all of them, the rows Redis holds in memory). Redis answers from a
	// process of its own, on another core: its CPU is counted beside the
	// client's.
	for _, name := range []string{"store (hot tier + Pebble, fresh batches)", "store (same batches again)"} {
		var rd, st Result
		var rdCPU, srvCPU, stCPU time.Duration
		before := e.Store.Metrics()
		for _, part := range rounds(batches, 5) {
			c0, s0 := cpuTime(), r.CPU()
			a, err := e.RedisLookup(r, part)
			if err != nil {
				return err
			}
			c1, s1 := cpuTime(), r.CPU()
			b, err := e.StoreLookup(name, part)
			if err != nil {
				return err
			}
			rdCPU, srvCPU, stCPU = rdCPU+c1-c0, srvCPU+s1-s0, stCPU+cpuTime()-c1
			rd, st = merge(rd, a), merge(st, b)
		}
		after := e.Store.Metrics()
		hits, miss := after.HotHits-before.HotHits, after.HotMisses-before.HotMisses
		fmt.Fprintln(w, "  ", rd)
		fmt.Fprintln(w, "  ", st)
		fmt.Fprintf(w, "   store/redis: %.1fx rows/s, p99 %.3fx of redis's; store hot hit ratio %.4f\n", st.RowsPerSec()/rd.RowsPerSec(), float64(st.Quantile(0.99))/float64(rd.Quantile(0.99)), float64(hits)/float64(hits+miss))
		per := func(d time.Duration) time.Duration {
			return (d / time.Duration(max(1, len(st.Latencies)))).Round(time.Microsecond)
		}
		fmt.Fprintf(w, "   CPU per batch: redis %s (client %s + redis-server %s), store %s\n", per(rdCPU+srvCPU), per(rdCPU), per(srvCPU), per(stCPU))
	}
	return nil
}

package loadgen

import (
	"math"
	"testing"
	"time"
)

// arrivals draws a schedule's send times up to d.
func arrivals(t *testing.T, p Profile, poisson bool, seed uint64, d time.Duration) []time.Duration {
	t.Helper()
	s, err := NewSchedule(p, poisson, seed)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	prev := time.Duration(-1)
	for {
		at := s.Next()
		if at < prev {
			t.Fatalf("arrival %d at %v before %v", len(out), at, prev)
		}
		if at >= d {
			return out
		}
		out = append(out, at)
		prev = at
	}
}

// counts bins arrivals into windows of w.
func counts(ts []time.Duration, w, d time.Duration) []float64 {
	c := make([]float64, int(d/w))
	for _, t := range ts {
		if i := int(t / w); i < len(c) {
			c[i]++
		}
	}
	return c
}

func TestConstantEven(t *testing.T) {
	ts := arrivals(t, Constant(1000), false, 1, 10*time.Second)
	if len(ts) < 9999 || len(ts) > 10001 {
		t.Fatalf("%d arrivals in 10s at 1000/s", len(ts))
	}
	for i := 1; i < len(ts); i++ {
		if g := ts[i] - ts[i-1]; g < 999*time.Microsecond || g > 1001*time.Microsecond {
			t.Fatalf("gap %d is %v, want 1ms", i, g)
		}
	}
}

func TestPoissonRateAndDispersion(t *testing.T) {
	const rate, secs = 2000.0, 20
	ts := arrivals(t, Constant(rate), true, 7, secs*time.Second)
	n := float64(len(ts))
	if want := rate * secs; math.Abs(n-want) > 4*math.Sqrt(want) {
		t.Fatalf("%v arrivals, want %v ± 4σ", n, want)
	}
	// Exponential gaps: coefficient of variation 1.
	var sum, sq float64
	for i := 1; i < len(ts); i++ {
		g := (ts[i] - ts[i-1]).Seconds()
		sum += g
		sq += g * g
	}
	m := sum / (n - 1)
	cv := math.Sqrt(sq/(n-1)-m*m) / m
	if math.Abs(cv-1) > 0.03 {
		t.Fatalf("gap CV %.3f, want 1 (exponential)", cv)
	}
	// Counts per 100ms: Poisson, so variance over mean about 1.
	c := counts(ts, 100*time.Millisecond, secs*time.Second)
	var cm, cv2 float64
	for _, x := range c {
		cm += x
	}
	cm /= float64(len(c))
	for _, x := range c {
		cv2 += (x - cm) * (x - cm)
	}
	cv2 /= float64(len(c) - 1)
	if d := cv2 / cm; d < 0.8 || d > 1.2 {
		t.Fatalf("index of dispersion %.3f, want about 1", d)
	}
}

func TestScheduleDeterministic(t *testing.T) {
	a := arrivals(t, Constant(500), true, 42, 2*time.Second)
	b := arrivals(t, Constant(500), true, 42, 2*time.Second)
	c := arrivals(t, Constant(500), true, 43, 2*time.Second)
	if len(a) != len(b) {
		t.Fatalf("same seed, %d and %d arrivals", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed differs at %d", i)
		}
	}
	if len(a) == len(c) && a[len(a)/2] == c[len(c)/2] {
		t.Fatal("different seeds gave the same schedule")
	}
}

func TestPromotionShape(t *testing.T) {
	const day = 100 * time.Second
	p := &Promotion{Peak: 1000}
	p.EnsureDefaults(day)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	// The daily baseline: valley at the start, peak at noon, ratio 6.5.
	if v, pk := p.Diurnal(0), p.Diurnal(day/2); math.Abs(pk/v-6.5) > 1e-9 || pk != 1000 {
		t.Fatalf("valley %v peak %v", v, pk)
	}
	for _, poisson := range []bool{false, true} {
		ts := arrivals(t, p, poisson, 3, day)
		c := counts(ts, time.Second, day)
		// Every second carries its integrated rate, within 4σ (Poisson) or 2 (even).
		for i, got := range c {
			want := 0.0
			for k := range 100 {
				want += p.Rate(time.Duration(i)*time.Second+time.Duration(k)*10*time.Millisecond) / 100
			}
			tol := 2.0
			if poisson {
				tol = 4*math.Sqrt(want) + 1
			}
			if math.Abs(got-want) > tol {
				t.Fatalf("poisson=%v second %d: %v arrivals, want %.1f ± %.1f", poisson, i, got, want, tol)
			}
		}
		// The plateau runs at 1.3x the normal peak, the night at 1/6.5 of it.
		plateau := c[52:59]
		night := c[0:3]
		mean := func(x []float64) float64 {
			s := 0.0
			for _, v := range x {
				s += v
			}
			return s / float64(len(x))
		}
		if m := mean(plateau); math.Abs(m-1300) > 40 {
			t.Fatalf("poisson=%v plateau %.0f req/s, want 1300", poisson, m)
		}
		if r := mean(plateau) / mean(night); r < 1.3*6.5*0.85 {
			t.Fatalf("poisson=%v plateau over night %.2f, want about %.2f", poisson, r, 1.3*6.5)
		}
	}
}

func TestReplayCompressAndScale(t *testing.T) {
	tr := &Trace{Step: time.Minute, Rates: []float64{1, 2, 4, 3}}
	r := &Replay{Trace: tr, Speedup: 60, Scale: 100} // a trace minute per second
	ts := arrivals(t, r, false, 1, 4*time.Second)
	c := counts(ts, time.Second, 4*time.Second)
	for i, want := range []float64{100, 200, 400, 300} {
		if math.Abs(c[i]-want) > 2 {
			t.Fatalf("second %d: %v arrivals, want %v", i, c[i], want)
		}
	}
	if r.MaxRate() != 400 {
		t.Fatalf("max rate %v", r.MaxRate())
	}
	// Past the end it starts over.
	if r.Rate(5*time.Second) != 200 {
		t.Fatalf("rate after the end %v", r.Rate(5*time.Second))
	}
}

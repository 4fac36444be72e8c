package hot

// sketch is a count-min sketch of 4-bit counters (TinyLFU's frequency
// estimator, laid out as Caffeine's): the four counters of a key live in
// one 64-bit word, so recording an access touches one cache line. After
// sampleSize increments every counter is halved, so the estimate follows
// the recent popularity instead of all history.
type sketch struct {
	words      []uint64
	mask       uint64
	additions  int
	sampleSize int
}

func newSketch(capacity int) *sketch {
	n := nextPow2(max(capacity, 64))
	return &sketch{words: make([]uint64, n), mask: uint64(n - 1), sampleSize: 10 * max(capacity, 64)}
}

// nibbles picks the word and the four counters (nibble indices 0..15) of h.
func (s *sketch) slot(h uint64) (w uint64, n0, n1, n2, n3 uint) {
	w = h & s.mask
	g := h >> 40
	return w, uint(g & 15), uint(g>>4&15) ^ 4, uint(g>>8&15) ^ 8, uint(g>>12&15) ^ 12
}

// add records one access of the key with hash h.
func (s *sketch) add(h uint64) {
	w, a, b, c, d := s.slot(h)
	x := s.words[w]
	added := false
	for _, n := range [4]uint{a, b, c, d} {
		if (x>>(4*n))&15 < 15 {
			x += 1 << (4 * n)
			added = true
		}
	}
	s.words[w] = x
	if added {
		s.additions++
		if s.additions >= s.sampleSize {
			s.reset()
		}
	}
}

// estimate is the key's approximate recent access count (0..15).
func (s *sketch) estimate(h uint64) int {
	w, a, b, c, d := s.slot(h)
	x := s.words[w]
	m := uint64(15)
	for _, n := range [4]uint{a, b, c, d} {
		m = min(m, (x>>(4*n))&15)
	}
	return int(m)
}

// reset halves every counter (the "aging" of TinyLFU).
func (s *sketch) reset() {
	for i, x := range s.words {
		s.words[i] = (x >> 1) & 0x7777777777777777
	}
	s.additions /= 2
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

package hot

import "math"

// packInt8 writes row in an int8 class's form into dst (1 + dim/4
// words): the scale's bits, then one int8 per value, four to a word, low
// byte first. row must be what a row stored as int8 decodes to, value i
// being float32(q[i]) * scale in float32 arithmetic (store.Int8's
// decode); packInt8 recovers scale and q and checks that they give back
// every value's bits, false (dst undefined) when no scale does.
//
// The store's encoder sets scale = max|x| / 127, so the largest value
// decodes from q = ±127 and scale is within an ulp or two of max|v| /
// 127: those candidates are tried, nearest first.
func packInt8(dst, row []float32) bool {
	var m float32
	for _, v := range row {
		m = max(m, float32(math.Abs(float64(v))))
	}
	s0 := m / 127
	for _, step := range [...]int{0, 1, -1, 2, -2} {
		s := s0
		switch {
		case step > 0:
			for range step {
				s = math.Nextafter32(s, float32(math.Inf(1)))
			}
		case step < 0:
			for range -step {
				s = math.Nextafter32(s, 0)
			}
		}
		if packInt8Scale(dst, row, s) {
			return true
		}
		if m == 0 {
			break
		}
	}
	return false
}

// packInt8Scale packs row with scale s: false unless every value is
// float32(q) * s for an int8 q in [-127, 127].
func packInt8Scale(dst, row []float32, s float32) bool {
	if s < 0 || math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
		return false
	}
	dst[0] = s
	for j := range len(dst) - 1 {
		var w uint32
		for k := range 4 {
			i := 4*j + k
			if i >= len(row) {
				break
			}
			v := row[i]
			var q float64
			if s > 0 {
				q = math.Round(float64(v) / float64(s))
			}
			if !(q >= -127 && q <= 127) || math.Float32bits(float32(int8(q))*s) != math.Float32bits(v) {
				return false
			}
			w |= uint32(uint8(int8(q))) << (8 * k)
		}
		dst[1+j] = math.Float32frombits(w)
	}
	return true
}

// widenInt8InPlace widens the int8 form held in row's last words floats
// (packInt8's layout) into the whole row. The scale is read first; word
// j (values 4j to 4j+3) is read before its values are written, and those
// never reach a word not yet read: 4j+3 < len(row)-words+j+2 for every
// word but the last when len(row) >= minInt8Dim (words = 1 + len(row)/4
// rounded up).
func widenInt8InPlace(row []float32, words int) {
	n := len(row)
	base := n - words
	s := row[base]
	for j := range words - 1 {
		w := math.Float32bits(row[base+1+j])
		i := 4 * j
		if i+3 < n {
			row[i] = float32(int8(w)) * s
			row[i+1] = float32(int8(w>>8)) * s
			row[i+2] = float32(int8(w>>16)) * s
			row[i+3] = float32(int8(w>>24)) * s
			continue
		}
		for k := 0; i+k < n; k++ {
			row[i+k] = float32(int8(w>>(8*k))) * s
		}
	}
}

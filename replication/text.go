package replication

import (
	"encoding/hex"
	"strconv"
	"time"
)

// quote quotes v for an error message, cut to a readable length.
func quote(v []byte) string {
	const max = 64
	if len(v) > max {
		return strconv.Quote(string(v[:max])) + "..."
	}
	return strconv.Quote(string(v))
}

// parseInt64 parses the text form of an int2, int4 or int8.
func parseInt64(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	limit := uint64(1<<63 - 1)
	if neg {
		limit++
	}
	var u uint64
	for _, c := range b {
		c -= '0'
		if c > 9 {
			return 0, false
		}
		u = u*10 + uint64(c) // cannot overflow uint64 with at most 19 digits
	}
	if u > limit {
		return 0, false
	}
	if neg {
		return -int64(u-1) - 1, true
	}
	return int64(u), true
}

// decodeByteaHex decodes bytea's hex output format, `\x` followed by two hex
// digits per byte.
func decodeByteaHex(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' || len(v)%2 != 0 {
		return nil, false
	}
	out := make([]byte, (len(v)-2)/2)
	if _, err := hex.Decode(out, v[2:]); err != nil {
		return nil, false
	}
	return out, true
}

// parseTimestamp parses the ISO text output (DateStyle ISO) of a timestamptz,
// `2006-01-02 15:04:05[.999999]±07[:00[:00]]`, or of a timestamp, which has
// no offset and is taken as UTC. BC dates and infinities are not accepted.
func parseTimestamp(b []byte) (time.Time, bool) {
	year, i, ok := digits(b, 0, 4, 9)
	if !ok || year < 1 || !sep(b, i, '-') {
		return time.Time{}, false
	}
	month, i, ok := digits(b, i+1, 2, 2)
	if !ok || month < 1 || month > 12 || !sep(b, i, '-') {
		return time.Time{}, false
	}
	day, i, ok := digits(b, i+1, 2, 2)
	if !ok || day < 1 || day > daysIn(month, year) || !sep(b, i, ' ') {
		return time.Time{}, false
	}
	hour, i, ok := digits(b, i+1, 2, 2)
	if !ok || hour > 23 || !sep(b, i, ':') {
		return time.Time{}, false
	}
	minute, i, ok := digits(b, i+1, 2, 2)
	if !ok || minute > 59 || !sep(b, i, ':') {
		return time.Time{}, false
	}
	sec, i, ok := digits(b, i+1, 2, 2)
	if !ok || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if sep(b, i, '.') {
		start := i + 1
		if nsec, i, ok = digits(b, start, 1, 9); !ok {
			return time.Time{}, false
		}
		for n := i - start; n < 9; n++ {
			nsec *= 10
		}
	}
	offset := 0
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		sign := 1
		if b[i] == '-' {
			sign = -1
		}
		var h, m, s int
		if h, i, ok = digits(b, i+1, 2, 2); !ok || h > 15 {
			return time.Time{}, false
		}
		if sep(b, i, ':') {
			if m, i, ok = digits(b, i+1, 2, 2); !ok || m > 59 {
				return time.Time{}, false
			}
			if sep(b, i, ':') {
				if s, i, ok = digits(b, i+1, 2, 2); !ok || s > 59 {
					return time.Time{}, false
				}
			}
		}
		offset = sign * (h*3600 + m*60 + s)
	}
	if i != len(b) {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

// digits reads between min and max decimal digits at i.
func digits(b []byte, i, min, max int) (int, int, bool) {
	v, start := 0, i
	for ; i < len(b) && i-start < max; i++ {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + int(c)
	}
	return v, i, i-start >= min
}

func sep(b []byte, i int, c byte) bool { return i < len(b) && b[i] == c }

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

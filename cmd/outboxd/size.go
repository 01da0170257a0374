package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteSize is a flag of a number of bytes that takes units: 64MiB, 1GiB,
// 900KB, 1048576. IEC units (KiB, MiB, GiB, TiB) are powers of 1024, SI
// units (kB/KB, MB, GB, TB) powers of 1000, as Kafka's and PostgreSQL's
// documentation use them; a bare number is bytes.
type byteSize struct {
	p   *int64
	max int64 // the largest value the setting holds
}

// bytesVar defines a byte-size flag on an int64.
func bytesVar(fs *flagSet, p *int64, name string, value int64, usage string, opts ...opt) {
	*p = value
	fs.Var(&byteSize{p: p, max: math.MaxInt64}, name, usage, opts...)
}

// bytesIntVar defines a byte-size flag on an int.
func bytesIntVar(fs *flagSet, p *int, name string, value int, usage string, opts ...opt) {
	v := new(int64)
	*v = int64(value)
	*p = value
	fs.Var(&intBytes{byteSize: byteSize{p: v, max: math.MaxInt32}, out: p}, name, usage, opts...)
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"KB", 1e3}, {"B", 1},
}

func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || (n > 0 && mult > math.MaxInt64/n) {
		return 0, fmt.Errorf("%q is not a size: want a number of bytes, or one with a unit, e.g. 64MiB, 900KB, 1GiB", s)
	}
	return n * mult, nil
}

// formatByteSize writes n with the largest IEC unit that divides it.
func formatByteSize(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) String() string {
	if b == nil || b.p == nil {
		return "0"
	}
	return formatByteSize(*b.p)
}

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	if n > b.max {
		return fmt.Errorf("%s is more than the largest size this setting takes (%s)", s, formatByteSize(b.max))
	}
	*b.p = n
	return nil
}

// Get makes flagType call it a size.
func (b *byteSize) Get() any { return sizeValue(*b.p) }

// sizeValue marks a byte-size flag's value for flagType.
type sizeValue int64

// intBytes is a byteSize that also writes an int.
type intBytes struct {
	byteSize
	out *int
}

func (b *intBytes) Set(s string) error {
	if err := b.byteSize.Set(s); err != nil {
		return err
	}
	*b.out = int(*b.p)
	return nil
}

package replication

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestParseTimelineHistory(t *testing.T) {
	ends, err := ParseTimelineHistory([]byte("1\t0/3000158\tno recovery target specified\n\n# comment\n2\t0/5000000\tbefore 2026-12-02 01:00:00+00\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 2 || ends[1] != 0x3000158 || ends[2] != 0x5000000 {
		t.Fatalf("ends %v", ends)
	}
	h := &History{Timeline: 3, Flushed: 0x6000000, Ends: ends}
	for _, c := range []struct {
		tli  int32
		lsn  uint64
		want bool
	}{{1, 0x3000158, true}, {1, 0x3000159, false}, {2, 0x4000000, true}, {3, 0x6000000, true}, {3, 0x6000001, false}, {4, 1, false}} {
		if got := h.Contains(c.tli, pglogrepl.LSN(c.lsn)); got != c.want {
			t.Errorf("Contains(%d, %x) = %v", c.tli, c.lsn, got)
		}
	}
	if _, err := ParseTimelineHistory([]byte("x\t0/1\n")); err == nil {
		t.Error("bad timeline accepted")
	}
}

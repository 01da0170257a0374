package democheck

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	good := Counts{Orders: 100, Pending: 0, Unique: 100, EndOffsets: 160, Skipped: 60, Projected: 100, DLQ: 3}
	for _, a := range good.Check(100, 3) {
		if !a.OK {
			t.Errorf("%s = %d (want %s) failed on good counts", a.Name, a.Got, a.Want)
		}
	}
	for name, mutate := range map[string]func(*Counts){
		"orders":                func(c *Counts) { c.Orders = 99 },
		"outbox pending":        func(c *Counts) { c.Pending = 1 },
		"unique processed":      func(c *Counts) { c.Unique = 99 },
		"end offsets":           func(c *Counts) { c.EndOffsets, c.Skipped = 99, -1 },
		"skipped duplicates":    func(c *Counts) { c.Skipped = 59 },
		"projected orders":      func(c *Counts) { c.Projected = 101 },
		"DLQ":                   func(c *Counts) { c.DLQ = 4 },
		"orders not sent":       func(c *Counts) { c.Unsent = 1 },
		"projection mismatches": func(c *Counts) { c.Mismatched = 1 },
	} {
		c := good
		mutate(&c)
		var failed []string
		for _, a := range c.Check(100, 3) {
			if !a.OK {
				failed = append(failed, a.Name)
			}
		}
		if len(failed) != 1 || failed[0] != name {
			t.Errorf("breaking %s failed %v", name, failed)
		}
		var out strings.Builder
		if c.Report(&out, Names{OrdersTopic: "o", StatusTopic: "s"}, 100, 3) || !strings.Contains(out.String(), "check: FAILED") {
			t.Errorf("breaking %s: Report passed:\n%s", name, out.String())
		}
	}
}

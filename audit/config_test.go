package audit

import (
	"strings"
	"testing"
	"time"
)

// TestAuditConfigValidate: a range is by id or by time, never both or
// neither, and never backwards.
func TestAuditConfigValidate(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		mod  func(*Config)
		want string // "" : valid
	}{
		{func(c *Config) { c.FromID = 1 }, ""},
		{func(c *Config) { c.FromID, c.ToID = 1, 10 }, ""},
		{func(c *Config) { c.Since = now.Add(-time.Hour) }, ""},
		{func(c *Config) { c.Since, c.Until = now.Add(-time.Hour), now }, ""},
		{func(c *Config) {}, "select the rows to audit"},
		{func(c *Config) { c.FromID, c.Since = 1, now }, "not both"},
		{func(c *Config) { c.FromID, c.ToID = 10, 3 }, "below --from-id"},
		{func(c *Config) { c.Until = now }, "--until needs --since"},
		{func(c *Config) { c.Since, c.Until = now, now.Add(-time.Hour) }, "is not after"},
		{func(c *Config) { c.FromID, c.StableTimeout = 1, 0 }, "--stable-timeout"},
	} {
		cfg := DefaultConfig()
		c.mod(&cfg)
		err := cfg.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", cfg, err, c.want)
		}
	}
}

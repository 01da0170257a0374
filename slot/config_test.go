package slot

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultConfigIsValid(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	want := Config{Slot: "outboxd", Publication: "outboxd", Schema: "public", Table: "outbox", Failover: true}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("DefaultConfig() = %+v, want %+v", cfg, want)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		modify func(*Config)
		want   string // "" for valid; else the complete message
	}{
		{"underscore and digits", func(c *Config) { c.Slot = "_outboxd_2" }, ""},
		{"dollar in publication", func(c *Config) { c.Publication = "pub$1" }, ""},
		{"63 bytes", func(c *Config) { c.Table = strings.Repeat("t", 63) }, ""},
		{"empty slot", func(c *Config) { c.Slot = "" },
			`invalid slot configuration: Slot is empty: set it, or start from DefaultConfig() (Slot "outboxd")`},
		{"empty table", func(c *Config) { c.Table = "" },
			`invalid slot configuration: Table is empty: set it, or start from DefaultConfig() (Table "outbox")`},
		{"upper case", func(c *Config) { c.Publication = "Outboxd" },
			`invalid slot configuration: Publication "Outboxd" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_$]*)`},
		{"leading digit", func(c *Config) { c.Schema = "1public" },
			`invalid slot configuration: Schema "1public" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_$]*)`},
		{"dash", func(c *Config) { c.Table = "out-box" },
			`invalid slot configuration: Table "out-box" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_$]*)`},
		{"quote", func(c *Config) { c.Table = `x"; DROP TABLE y; --` },
			`invalid slot configuration: Table "x\"; DROP TABLE y; --" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_$]*)`},
		{"dollar in slot", func(c *Config) { c.Slot = "slot$1" },
			`invalid slot configuration: Slot "slot$1" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_]*)`},
		{"64 bytes", func(c *Config) { c.Slot = strings.Repeat("s", 64) },
			`invalid slot configuration: Slot "` + strings.Repeat("s", 64) + `" is 64 bytes long, PostgreSQL allows at most 63: choose a shorter name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.modify(&cfg)
			err := cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Validate() = %v\nwant %s", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("errors.Is(err, ErrInvalidConfig) = false")
			}
		})
	}
}

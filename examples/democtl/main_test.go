package main

import "testing"

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h:5/outboxd?sslmode=disable": "postgres://u@h:5/demo?sslmode=disable",
		"postgresql://u:p@h/x":                     "postgresql://u:p@h/demo",
		"host=h port=5 dbname=outboxd":             "host=h port=5 dbname=outboxd dbname=demo",
	} {
		if got, err := withDatabase(in, "demo"); err != nil || got != want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := withDatabase("", "demo"); err == nil {
		t.Error("an empty DSN was accepted")
	}
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// redraw reads a committed report (results.json or network.json) and
// draws its chart again next to it (bench.png or network.png), without
// measuring anything; with markdown it also writes the report's .md again
// (the same data; a changed template or chart shows in git diff).
func redraw(path string, markdown bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var kind struct {
		Floors json.RawMessage `json:"floors"` // only the network report has them
	}
	if err := json.Unmarshal(b, &kind); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	dir := filepath.Dir(path)
	var r *report
	if kind.Floors != nil {
		var nr networkReport
		if err := json.Unmarshal(b, &nr); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if markdown {
			return nr.write(dir)
		}
		r = nr.chartReport()
		path = filepath.Join(dir, "network.png")
	} else {
		r = &report{}
		if err := json.Unmarshal(b, r); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if markdown {
			return r.write(dir)
		}
		path = filepath.Join(dir, "bench.png")
	}
	png, err := r.chart()
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return os.WriteFile(path, png, 0o644)
}

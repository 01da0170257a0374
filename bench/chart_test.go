package main

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestRedrawCommittedCharts draws the committed reports' charts again
// (bench -chart), into a copy of each report: every PNG decodes and has
// the size of a full chart.
func TestRedrawCommittedCharts(t *testing.T) {
	for json, chart := range map[string]string{"results.json": "bench.png", "network.json": "network.png"} {
		t.Run(json, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("results", json))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, json), b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := redraw(filepath.Join(dir, json), false); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(filepath.Join(dir, chart))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			img, err := png.Decode(f)
			if err != nil {
				t.Fatalf("%s: %v", chart, err)
			}
			if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 600 {
				t.Errorf("%s is %v, want a full chart", chart, b)
			}
		})
	}
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/publisher"
)

// The Grafana dashboard must chart every metric outboxd exports, and only
// those: a renamed metric would otherwise leave an empty panel.
func TestGrafanaDashboardCoversEveryMetric(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var exprs strings.Builder
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	reg := prometheus.NewRegistry()
	m := publisher.NewMetrics(reg)
	for _, v := range []*prometheus.CounterVec{m.Published, m.PublishedBytes, m.ProduceErrors, m.DeadLettered, m.ProduceRetries} {
		v.WithLabelValues("t")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if mf.GetType().String() == "HISTOGRAM" {
			name += "_bucket"
		}
		if !strings.Contains(exprs.String(), name) {
			t.Errorf("no dashboard panel charts %s", name)
		}
	}
	if len(mfs) != 20 {
		t.Errorf("%d metric families, the dashboard was written for 20: update it", len(mfs))
	}
}

func TestExampleConfigFileIsValid(t *testing.T) {
	t.Parallel()
	if _, err := readConfigFile(filepath.Join(testenv.RepoRoot(t), "deploy", "outboxd.example.yaml")); err != nil {
		t.Fatal(err)
	}
}

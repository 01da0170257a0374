package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

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

// Every metric an alert rule names is one outboxd documents (and so
// exports: docs/operations.md's table is checked against the registry by
// the dashboard test's count); a renamed metric would leave an alert that
// never fires.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(t)
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`outboxd_[a-z_]+`).FindAllString(string(rules), -1)
	if len(names) < 10 {
		t.Fatalf("only %d metric names in the rules", len(names))
	}
	for _, n := range names {
		if !strings.Contains(string(ops), "`"+n) {
			t.Errorf("alert rule names %s, which docs/operations.md does not list", n)
		}
	}
}

// The Kubernetes ConfigMap's settings file is one outboxd reads, and the
// kustomization lists every manifest.
func TestKubernetesManifestsHoldAValidConfigAndAreAllListed(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testenv.RepoRoot(t), "deploy", "kubernetes")
	b, err := os.ReadFile(filepath.Join(dir, "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, "outboxd.yaml", cm.Data["outboxd.yaml"])
	if _, err := readConfigFile(file); err != nil {
		t.Errorf("the ConfigMap's outboxd.yaml: %v", err)
	}
	kust, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !strings.Contains(string(kust), "- "+base) {
			t.Errorf("kustomization.yaml does not list %s", base)
		}
	}
}

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
	"github.com/outboxd/outboxd/outbox"
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
	m := outbox.NewMetrics(reg)
	for _, v := range []*prometheus.CounterVec{m.Published, m.PublishedBytes, m.ProduceErrors, m.DeadLettered, m.ProduceRetries} {
		v.WithLabelValues("t")
	}
	// The safe WAL size has a series only when PostgreSQL reports one.
	safe := int64(1 << 30)
	m.ObserveSlot(outbox.SlotPoll{WALStatus: "reserved", SafeWALSize: &safe})
	newAuditMetrics(reg) // with --audit-interval
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
	if len(mfs) != 32 {
		t.Errorf("%d metric families, the dashboard was written for 32: update it", len(mfs))
	}
}

func TestExampleConfigFileIsValid(t *testing.T) {
	t.Parallel()
	if _, err := readConfigFile(filepath.Join(testenv.RepoRoot(t), "deploy", "outboxd.example.yaml")); err != nil {
		t.Fatal(err)
	}
}

// Every metric an alert rule names is one outboxd registers: a renamed
// metric would leave an alert that never fires.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingRegisterer{}
	outbox.NewMetrics(rec)
	registerBuildInfo(rec)
	newAuditMetrics(rec)
	exported := rec.names(t)
	names := regexp.MustCompile(`outboxd_[a-z_]+`).FindAllString(string(rules), -1)
	if len(names) < 10 {
		t.Fatalf("only %d metric names in the rules", len(names))
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("alert rule names %s, which outboxd does not export", n)
		}
	}
}

// recordingRegisterer keeps what is registered, to name every metric
// family, vectors without children too (Gather leaves those out).
type recordingRegisterer struct{ cs []prometheus.Collector }

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return nil
}
func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recordingRegisterer) Unregister(prometheus.Collector) bool    { return false }

func (r *recordingRegisterer) names(t *testing.T) map[string]bool {
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		for _, c := range r.cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metric names registered: %v", len(out), out)
	}
	return out
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

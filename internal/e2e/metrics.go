package e2e

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What operators see: the metrics endpoint.

// MetricsAddrLog finds the address outboxd serves metrics on in its log.
var MetricsAddrLog = regexp.MustCompile(`serving metrics\s+\{"addr": "([^"]+)"\}`)

// StartWithMetrics starts outboxd with --metrics-addr on a free port and
// returns the daemon and its base URL.
func (e *Env) StartWithMetrics(extra ...string) (*Daemon, string) {
	e.T.Helper()
	d := StartDaemon(e.T, e.Args(append([]string{"--metrics-addr", "127.0.0.1:0"}, extra...)...)...)
	d.WaitLog("serving metrics", 60*time.Second)
	m := MetricsAddrLog.FindStringSubmatch(d.Out.String())
	if m == nil {
		e.T.Fatalf("no metrics address in the log:\n%s", d.Out.String())
	}
	return d, "http://" + m[1]
}

// Get is an HTTP GET that must be answered: the status code and body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// Scrape reads /metrics into name{labels} → value (labels as exposed).
func Scrape(t testing.TB, base string) map[string]float64 {
	t.Helper()
	code, body := Get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: HTTP %d", code)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// One returns the value of a series that must exist.
func One(t testing.TB, m map[string]float64, series string) float64 {
	t.Helper()
	v, ok := m[series]
	if !ok {
		t.Fatalf("no series %s in /metrics", series)
	}
	return v
}

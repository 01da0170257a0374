package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The profiler is served only when asked for (--pprof): it shows the
// process's internals to whoever reaches the metrics address.
func TestProfilerOnlyWithPprof(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		mux := healthMux(prometheus.NewRegistry(), nil, "s", time.Minute, on)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/goroutine?debug=1", nil))
		if got := rec.Code == http.StatusOK; got != on {
			t.Fatalf("--pprof=%v: /debug/pprof/goroutine answered %d", on, rec.Code)
		}
		rec = httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("--pprof=%v: /metrics answered %d", on, rec.Code)
		}
	}
}

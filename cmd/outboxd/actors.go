package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// addHTTPServer adds an actor serving h (metrics and health) on addr. The
// listener is opened now, so a busy address fails at start.
func addHTTPServer(g *run.Group, addr string, h http.Handler, logger *zap.Logger) error {
	s, err := listenHTTP(addr, h, logger)
	if err != nil {
		return err
	}
	s.add(g)
	return nil
}

// httpServer is the metrics and health server. run opens it before anything
// else (listenHTTP): a bad or busy --metrics-addr then fails before a slot
// was created, and /healthz answers while start-up still waits for Kafka or
// PostgreSQL, so a liveness probe does not kill a process that is only
// waiting. Its handler is swapped once the service exists (setHandler).
type httpServer struct {
	srv  *http.Server
	ln   net.Listener
	h    atomic.Pointer[http.Handler]
	done chan error // Serve's result
	log  *zap.Logger
}

// listenHTTP opens addr and serves h on it at once.
func listenHTTP(addr string, h http.Handler, logger *zap.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %q: %w", addr, err)
	}
	s := &httpServer{ln: ln, done: make(chan error, 1), log: logger}
	s.setHandler(h)
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*s.h.Load()).ServeHTTP(w, r) })}
	logger.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

func (s *httpServer) setHandler(h http.Handler) { s.h.Store(&h) }

// add hands the server to g: the actor ends with the server, and
// interrupting it shuts the server down.
func (s *httpServer) add(g *run.Group) {
	g.Add(func() error {
		if err := <-s.done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) { s.close() })
}

// close shuts the server down; a second call (the group's, then run's
// deferred one) does nothing more.
func (s *httpServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// startingMux serves while start-up checks Kafka and PostgreSQL: the process
// is alive, not ready.
func startingMux(reg *prometheus.Registry, withPprof bool) *http.ServeMux {
	mux := baseMux(reg, withPprof)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: starting (checking Kafka and PostgreSQL, creating the publication and slot)")
	})
	return mux
}

// baseMux serves what the HTTP server of either source has: /metrics,
// /healthz (the process answers) and, with withPprof, the profiler. Each
// source adds its own /readyz.
func baseMux(reg *prometheus.Registry, withPprof bool) *http.ServeMux {
	mux := http.NewServeMux()
	if withPprof {
		addPprof(mux)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// addPprof serves Go's profiler under /debug/pprof/ on mux (--pprof): CPU,
// heap, goroutines and blocking, for finding where a running daemon's time
// goes. Off by default: a profile costs CPU while it runs and shows the
// process's internals to whoever reaches the address.
func addPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// runGroup runs the actors until the first returns; a signal is a clean stop.
func runGroup(g *run.Group, logger *zap.Logger) error {
	err := g.Run()
	if errors.Is(err, run.ErrSignal) {
		logger.Info("stopped", zap.String("reason", err.Error()))
		return nil
	}
	return err
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// addHTTPServer adds an actor serving h (metrics and health) on addr. The
// listener is opened now, so a busy address fails at start.
func addHTTPServer(g *run.Group, addr string, h http.Handler, logger *zap.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %q: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	g.Add(func() error {
		logger.Info("serving metrics", zap.String("addr", ln.Addr().String()))
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return nil
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

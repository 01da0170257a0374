// Command netproxy runs internal/netproxy's TCP proxies with an HTTP API to
// switch their faults at run time; dev/stack proxy-start runs it.
//
//	netproxy -api 127.0.0.1:PORT [-rtt 1ms] NAME=LISTEN_ADDR=UPSTREAM_ADDR...
//
// It prints "ready" once every proxy listens, and stops on SIGTERM or
// SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/internal/netproxy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "netproxy:", err)
		os.Exit(1)
	}
}

func run() error {
	api := flag.String("api", "127.0.0.1:0", "address of the HTTP API")
	rtt := flag.Duration("rtt", 0, "initial round-trip delay of every proxy")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: netproxy -api ADDR [-rtt DURATION] NAME=LISTEN_ADDR=UPSTREAM_ADDR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		return errors.New("no proxy given")
	}
	var proxies []*netproxy.Proxy
	defer func() {
		for _, p := range proxies {
			p.Close()
		}
	}()
	for _, a := range flag.Args() {
		f := strings.Split(a, "=")
		if len(f) != 3 || f[0] == "" || f[1] == "" || f[2] == "" {
			return fmt.Errorf("%q: want NAME=LISTEN_ADDR=UPSTREAM_ADDR", a)
		}
		p, err := netproxy.Listen(f[0], f[1], f[2])
		if err != nil {
			return fmt.Errorf("proxy %s: %w", f[0], err)
		}
		p.Set(netproxy.Faults{Delay: *rtt / 2})
		proxies = append(proxies, p)
	}
	ln, err := net.Listen("tcp", *api)
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	srv := &http.Server{Handler: netproxy.Handler(proxies), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	fmt.Printf("ready api=%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

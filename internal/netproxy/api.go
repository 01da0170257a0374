package netproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Status is one proxy as the API reports it.
type Status struct {
	Name      string `json:"name"`
	Listen    string `json:"listen"`
	Upstream  string `json:"upstream"`
	Delay     string `json:"delay"`
	Jitter    string `json:"jitter"`
	Bandwidth int64  `json:"bandwidth"`
	Blackhole bool   `json:"blackhole"`
	Conns     int    `json:"conns"`
}

func (p *Proxy) status() Status {
	f := p.Faults()
	return Status{Name: p.Name, Listen: p.Addr(), Upstream: p.Upstream, Delay: f.Delay.String(), Jitter: f.Jitter.String(),
		Bandwidth: f.Bandwidth, Blackhole: f.Blackhole, Conns: p.Conns()}
}

// Apply changes f by settings given as key=value strings: delay=DURATION
// (each direction), rtt=DURATION (delay = rtt/2), jitter=DURATION,
// bandwidth=BYTES_PER_SECOND (0: none), blackhole=on|off. Keys not given
// keep their value.
func Apply(f Faults, get func(string) (string, bool)) (Faults, error) {
	dur := func(k string, into *time.Duration, scale int64) error {
		if v, ok := get(k); ok {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("%s=%q: want a duration such as 1ms", k, v)
			}
			*into = d / time.Duration(scale)
		}
		return nil
	}
	if err := dur("delay", &f.Delay, 1); err != nil {
		return f, err
	}
	if err := dur("rtt", &f.Delay, 2); err != nil {
		return f, err
	}
	if err := dur("jitter", &f.Jitter, 1); err != nil {
		return f, err
	}
	if v, ok := get("bandwidth"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return f, fmt.Errorf("bandwidth=%q: want bytes per second (0: no cap)", v)
		}
		f.Bandwidth = n
	}
	if v, ok := get("blackhole"); ok {
		switch strings.ToLower(v) {
		case "on", "true", "1":
			f.Blackhole = true
		case "off", "false", "0":
			f.Blackhole = false
		default:
			return f, fmt.Errorf("blackhole=%q: want on or off", v)
		}
	}
	return f, nil
}

// Handler serves an HTTP API over proxies:
//
//	GET  /proxies                  every proxy and its faults (JSON)
//	POST /proxies/NAME?rtt=2ms&jitter=100us&bandwidth=0&blackhole=on
//	                               change some of NAME's faults (see Apply);
//	                               NAME "all" changes every proxy
//	POST /proxies/NAME/reset       cut NAME's open connections
func Handler(proxies []*Proxy) http.Handler {
	byName := map[string]*Proxy{}
	for _, p := range proxies {
		byName[p.Name] = p
	}
	list := func() []Status {
		out := []Status{}
		for _, p := range proxies {
			out = append(out, p.status())
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /proxies", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list())
	})
	pick := func(name string) ([]*Proxy, bool) {
		if name == "all" {
			return proxies, true
		}
		p, ok := byName[name]
		return []*Proxy{p}, ok
	}
	mux.HandleFunc("POST /proxies/{name}", func(w http.ResponseWriter, r *http.Request) {
		ps, ok := pick(r.PathValue("name"))
		if !ok {
			http.Error(w, "no proxy "+r.PathValue("name"), http.StatusNotFound)
			return
		}
		q := r.URL.Query()
		get := func(k string) (string, bool) {
			if !q.Has(k) {
				return "", false
			}
			return q.Get(k), true
		}
		for _, p := range ps {
			f, err := Apply(p.Faults(), get)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			p.Set(f)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list())
	})
	mux.HandleFunc("POST /proxies/{name}/reset", func(w http.ResponseWriter, r *http.Request) {
		ps, ok := pick(r.PathValue("name"))
		if !ok {
			http.Error(w, "no proxy "+r.PathValue("name"), http.StatusNotFound)
			return
		}
		for _, p := range ps {
			p.Reset()
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// floor is the produce round trip of one record, acks=all, to the bench's
// broker: what no publisher can beat on this machine. It is measured after
// the warm-up and again after the last cell, next to each table.
type floor struct {
	Records int     `json:"records"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

func (f floor) String() string {
	return fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (max %.2f) over %d records", f.P50Ms, f.P99Ms, f.MaxMs, f.Records)
}

// warmup is how the broker was warmed before the first cell.
type warmup struct {
	Seconds float64 `json:"seconds"`
	// WindowP50Ms are the p50 round trips of the windows, in order.
	WindowP50Ms []float64 `json:"window_p50_ms"`
	Stable      bool      `json:"stable"`
	Rule        string    `json:"rule"`
}

// roundTrips produces n single records one after another (acks=all, no
// batching: each waits for the previous) and returns their round trips in
// ms.
func roundTrips(p sarama.SyncProducer, topic string, n int) ([]float64, error) {
	out := make([]float64, 0, n)
	v := []byte(`{"warm": true}`)
	for range n {
		t0 := time.Now()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(v)}); err != nil {
			return out, err
		}
		out = append(out, float64(time.Since(t0).Microseconds())/1000)
	}
	return out, nil
}

func floorOf(ms []float64) floor {
	s := slices.Clone(ms)
	slices.Sort(s)
	if len(s) == 0 {
		return floor{}
	}
	return floor{Records: len(s), P50Ms: quantile(s, 0.5), P99Ms: quantile(s, 0.99), MaxMs: s[len(s)-1]}
}

func syncProducer(brokers []string) (sarama.SyncProducer, error) {
	return sarama.NewSyncProducer(brokers, producerConfig())
}

// Warm-up rule: windows of warmWindow round trips, one after another; the
// broker is warm when the p50 of each of the last warmStable windows is
// within warmTolerance of their median, after at least minWait.
const (
	warmWindow    = 500
	warmStable    = 3
	warmTolerance = 0.15
)

// warmBroker produces to a topic of its own until the round trip is stable
// (see the rule above) or maxWait passed, then measures the floor.
func warmBroker(ctx context.Context, st stack, minWait, maxWait time.Duration, logf func(string, ...any)) (warmup, floor, error) {
	w := warmup{Rule: fmt.Sprintf("windows of %d single-record produces (acks=all); warm when the p50 of each of the last %d windows is within %.0f%% of their median, after at least %s (at most %s)",
		warmWindow, warmStable, warmTolerance*100, minWait, maxWait)}
	topic, err := createTopic(st, "warm", 1)
	if err != nil {
		return w, floor{}, err
	}
	defer deleteTopic(st, topic)
	p, err := syncProducer(st.Brokers)
	if err != nil {
		return w, floor{}, err
	}
	defer p.Close()
	start := time.Now()
	for ctx.Err() == nil {
		ms, err := roundTrips(p, topic, warmWindow)
		if err != nil {
			return w, floor{}, err
		}
		w.WindowP50Ms = append(w.WindowP50Ms, math.Round(floorOf(ms).P50Ms*1000)/1000)
		elapsed := time.Since(start)
		if n := len(w.WindowP50Ms); n >= warmStable && elapsed >= minWait {
			last := slices.Clone(w.WindowP50Ms[n-warmStable:])
			slices.Sort(last)
			med := last[len(last)/2]
			if last[0] >= med*(1-warmTolerance) && last[len(last)-1] <= med*(1+warmTolerance) {
				w.Stable = true
				break
			}
		}
		if elapsed >= maxWait {
			break
		}
	}
	w.Seconds = time.Since(start).Seconds()
	ms, err := roundTrips(p, topic, 1000)
	if err != nil {
		return w, floor{}, err
	}
	f := floorOf(ms)
	last := w.WindowP50Ms[max(0, len(w.WindowP50Ms)-warmStable):]
	logf("broker warm-up: %.1f s, %d windows, stable %v (last window p50s %v ms); produce floor %s", w.Seconds, len(w.WindowP50Ms), w.Stable, last, f)
	return w, f, nil
}

// measureFloor measures the floor again (after the last cell).
func measureFloor(st stack) (floor, error) {
	topic, err := createTopic(st, "floor", 1)
	if err != nil {
		return floor{}, err
	}
	defer deleteTopic(st, topic)
	p, err := syncProducer(st.Brokers)
	if err != nil {
		return floor{}, err
	}
	defer p.Close()
	ms, err := roundTrips(p, topic, 1000)
	return floorOf(ms), err
}

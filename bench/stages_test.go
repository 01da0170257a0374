package main

import (
	"math"
	"strings"
	"testing"
)

const scrape0 = `# HELP outboxd_commit_to_ack_seconds Time from the Postgres commit to the Kafka acknowledgement of an event.
# TYPE outboxd_commit_to_ack_seconds histogram
outboxd_commit_to_ack_seconds_bucket{le="0.001"} 10
outboxd_commit_to_ack_seconds_bucket{le="0.002"} 10
outboxd_commit_to_ack_seconds_bucket{le="0.004"} 10
outboxd_commit_to_ack_seconds_bucket{le="+Inf"} 10
outboxd_commit_to_ack_seconds_sum 0.005
outboxd_commit_to_ack_seconds_count 10
outboxd_commit_to_receive_seconds_bucket{le="0.001"} 10
outboxd_commit_to_receive_seconds_bucket{le="0.002"} 10
outboxd_commit_to_receive_seconds_bucket{le="0.004"} 10
outboxd_commit_to_receive_seconds_bucket{le="+Inf"} 10
outboxd_events_published_total{topic="t"} 10
`

// 100 more events in the window: every one read within 1 ms, acknowledged
// between 2 and 4 ms.
const scrape1 = `outboxd_commit_to_ack_seconds_bucket{le="0.001"} 10
outboxd_commit_to_ack_seconds_bucket{le="0.002"} 10
outboxd_commit_to_ack_seconds_bucket{le="0.004"} 110
outboxd_commit_to_ack_seconds_bucket{le="+Inf"} 110
outboxd_commit_to_receive_seconds_bucket{le="0.001"} 110
outboxd_commit_to_receive_seconds_bucket{le="0.002"} 110
outboxd_commit_to_receive_seconds_bucket{le="0.004"} 110
outboxd_commit_to_receive_seconds_bucket{le="+Inf"} 110
`

// The window's quantiles come from the difference of two scrapes, and say
// on which side of outboxd's reader the time went.
func TestStagesBetweenScrapes(t *testing.T) {
	h0, err := parseHistograms(strings.NewReader(scrape0))
	if err != nil {
		t.Fatal(err)
	}
	h1, err := parseHistograms(strings.NewReader(scrape1))
	if err != nil {
		t.Fatal(err)
	}
	if len(h0) != 2 || len(h0[histAck]) != 4 || !math.IsInf(h0[histAck][3].le, 1) {
		t.Fatalf("parsed %v", h0)
	}
	s := stagesBetween(h0, h1)
	if s == nil || s.Events != 100 {
		t.Fatalf("stages %+v, want 100 events", s)
	}
	// Ranks 50 and 99 of 100 in (2 ms, 4 ms]: 3.0 and 3.98 ms.
	if s.AckP50Ms != 3 || s.AckP99Ms != 3.98 {
		t.Fatalf("ack p50 %v p99 %v, want 3 and 3.98", s.AckP50Ms, s.AckP99Ms)
	}
	if s.ReceiveP99Ms > 1 {
		t.Fatalf("receive p99 %v, want ≤ 1 ms", s.ReceiveP99Ms)
	}
	if side := s.side(); !strings.HasPrefix(side, "after") {
		t.Fatalf("side %q, want the Kafka side", side)
	}
	if got := stagesBetween(h1, h1); got != nil {
		t.Fatalf("no events in the window, got %+v", got)
	}
	pollOnly := histograms{histAck: h1[histAck]}
	if got := stagesBetween(histograms{histAck: h0[histAck]}, pollOnly); got != nil {
		t.Fatalf("commit → ack alone (the poll source), got %+v", got)
	}
	if got := stagesBetween(nil, nil); got != nil {
		t.Fatalf("no histograms (poll), got %+v", got)
	}
}

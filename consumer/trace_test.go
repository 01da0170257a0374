package consumer

import (
	"context"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// textMapCarrier is the method set of OpenTelemetry's
// propagation.TextMapCarrier, which HeaderCarrier must have.
type textMapCarrier interface {
	Get(key string) string
	Set(key, value string)
	Keys() []string
}

var _ textMapCarrier = HeaderCarrier{}

const testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	m := &Message{Headers: []Header{
		{Key: HeaderOutboxID, Value: []byte("7")},
		{Key: HeaderTraceParent, Value: []byte(testTraceParent)},
		{Key: "x", Value: []byte("1")},
		{Key: "x", Value: []byte("2")},
	}}
	c := HeaderCarrier{M: m}

	if got := c.Get(HeaderTraceParent); got != testTraceParent {
		t.Errorf("Get(traceparent) = %q", got)
	}
	if got := c.Get("Traceparent"); got != "" {
		t.Errorf("Get(Traceparent) = %q, want \"\" (keys match exactly)", got)
	}
	if got := c.Get("x"); got != "1" {
		t.Errorf("Get(x) = %q, want the first value", got)
	}
	if got := c.Get(HeaderTraceState); got != "" {
		t.Errorf("Get(tracestate) = %q, want \"\"", got)
	}
	if got, want := c.Keys(), []string{HeaderOutboxID, HeaderTraceParent, "x"}; !slices.Equal(got, want) {
		t.Errorf("Keys() = %q, want %q", got, want)
	}

	c.Set("x", "3")                // replaces, drops the duplicate
	c.Set(HeaderTraceState, "k=v") // appends
	want := []Header{
		{Key: HeaderOutboxID, Value: []byte("7")},
		{Key: HeaderTraceParent, Value: []byte(testTraceParent)},
		{Key: "x", Value: []byte("3")},
		{Key: HeaderTraceState, Value: []byte("k=v")},
	}
	if !slices.EqualFunc(m.Headers, want, func(a, b Header) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
		t.Errorf("headers after Set = %q, want %q", m.Headers, want)
	}
	if got := c.Get(HeaderTraceState); got != "k=v" {
		t.Errorf("Get(tracestate) after Set = %q", got)
	}

	empty := HeaderCarrier{M: &Message{}}
	if got := empty.Keys(); len(got) != 0 {
		t.Errorf("Keys() of no headers = %q", got)
	}
	empty.Set(HeaderTraceParent, testTraceParent)
	if got := empty.Get(HeaderTraceParent); got != testTraceParent {
		t.Errorf("Get after Set on no headers = %q", got)
	}
}

// TestTraceContextInHandlerCtx drives the processor (with the fake store) and
// checks the context the handler gets.
func TestTraceContextInHandlerCtx(t *testing.T) {
	t.Parallel()
	withTrace := func(cm *sarama.ConsumerMessage, kv ...string) *sarama.ConsumerMessage {
		for i := 0; i < len(kv); i += 2 {
			cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
		}
		return cm
	}
	for _, tc := range []struct {
		name string
		cm   *sarama.ConsumerMessage
		want TraceContext
		ok   bool
	}{
		{name: "traceparent and tracestate", ok: true,
			cm:   withTrace(msg(0, 1, "a"), HeaderTraceParent, testTraceParent, HeaderTraceState, "congo=t61rcWkgMzE"),
			want: TraceContext{TraceParent: testTraceParent, TraceState: "congo=t61rcWkgMzE"}},
		{name: "traceparent only", ok: true,
			cm:   withTrace(msg(0, 2, "a"), HeaderTraceParent, testTraceParent),
			want: TraceContext{TraceParent: testTraceParent}},
		{name: "no trace headers", cm: msg(0, 3, "a")},
		{name: "empty traceparent", cm: withTrace(msg(0, 4, "a"), HeaderTraceParent, "", HeaderTraceState, "k=v")},
		{name: "tracestate only", cm: withTrace(msg(0, 5, "a"), HeaderTraceState, "k=v")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, testConfig())
			var (
				got    TraceContext
				ok     bool
				called int
			)
			r.proc.h = HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *Message) error {
				called++
				got, ok = TraceContextFrom(ctx)
				return nil
			})
			res, err := r.process(t, tc.cm)
			if err != nil || res.Outcome != Processed {
				t.Fatalf("process = %+v, %v; want processed", res, err)
			}
			if called != 1 {
				t.Fatalf("handler called %d times", called)
			}
			if ok != tc.ok || got != tc.want {
				t.Errorf("TraceContextFrom(handler ctx) = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestTraceContextFromPlainCtx(t *testing.T) {
	t.Parallel()
	if tc, ok := TraceContextFrom(context.Background()); ok || tc != (TraceContext{}) {
		t.Errorf("TraceContextFrom(Background) = %+v, %v", tc, ok)
	}
}

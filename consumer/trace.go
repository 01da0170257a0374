package consumer

import "context"

// W3C Trace Context headers (https://www.w3.org/TR/trace-context/). The
// writing service puts them in the outbox row's headers; outboxd passes them
// through unchanged.
const (
	// HeaderTraceParent carries the trace id, parent span id and flags.
	HeaderTraceParent = "traceparent"
	// HeaderTraceState carries vendor-specific trace data.
	HeaderTraceState = "tracestate"
)

// TraceContext is the W3C trace context of a message: the raw values of its
// traceparent and tracestate headers, not validated.
type TraceContext struct {
	TraceParent string
	TraceState  string // empty when the message has no tracestate header
}

// traceContextKey is the context key of a TraceContext.
type traceContextKey struct{}

// TraceContextFrom returns the trace context of the message the handler was
// called for. ok is false when that message had no (or an empty)
// traceparent header.
func TraceContextFrom(ctx context.Context) (tc TraceContext, ok bool) {
	tc, ok = ctx.Value(traceContextKey{}).(TraceContext)
	return tc, ok
}

// handlerContext returns the context the handler gets for m: ctx carrying
// m's trace context when m has a non-empty traceparent header, else ctx.
func handlerContext(ctx context.Context, m *Message) context.Context {
	tp, _ := m.Header(HeaderTraceParent)
	if len(tp) == 0 {
		return ctx
	}
	ts, _ := m.Header(HeaderTraceState)
	return context.WithValue(ctx, traceContextKey{}, TraceContext{TraceParent: string(tp), TraceState: string(ts)})
}

// HeaderCarrier adapts a message's headers to the method set of
// OpenTelemetry's propagation.TextMapCarrier, so a propagator can extract the
// trace context of a message (or inject one into it):
//
//	ctx = otel.GetTextMapPropagator().Extract(ctx, consumer.HeaderCarrier{M: m})
//
// Keys match exactly, case-sensitively: W3C Trace Context header names are
// lowercase ([HeaderTraceParent], [HeaderTraceState]), and so are the names
// propagators ask for. M must not be nil.
type HeaderCarrier struct {
	M *Message
}

// Get returns the value of the first header named key, or "" when there is
// none.
func (c HeaderCarrier) Get(key string) string {
	v, _ := c.M.Header(key)
	return string(v)
}

// Set gives the header named key the value value: it replaces the value of
// the first header of that name and removes any later ones, or appends a
// header when there is none.
func (c HeaderCarrier) Set(key, value string) {
	hs, found := c.M.Headers[:0], false
	for _, h := range c.M.Headers {
		if h.Key == key {
			if found {
				continue
			}
			found, h.Value = true, []byte(value)
		}
		hs = append(hs, h)
	}
	if !found {
		hs = append(hs, Header{Key: key, Value: []byte(value)})
	}
	c.M.Headers = hs
}

// Keys returns the names of the message's headers in order, each once.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c.M.Headers))
	seen := make(map[string]bool, len(c.M.Headers))
	for _, h := range c.M.Headers {
		if !seen[h.Key] {
			seen[h.Key] = true
			keys = append(keys, h.Key)
		}
	}
	return keys
}

package publisher

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// Encoder rewrites a record's key, value and headers into a wire format
// (format.Encoder: Schema Registry formats, CloudEvents) before it is
// produced. The record comes from NewRecord: the value is the event's
// payload, the key its aggregate id.
//
// An error matching kafka.ErrPoison is the event's fault (a payload that
// does not fit its schema): a bad event, dead-lettered with the error as
// its reason or halting with the --skip-bad-event that skips it, exactly
// as a row the decoder cannot read. Any other error (a registry that does
// not answer) restarts the session: nothing past the event is confirmed,
// and the event is encoded again after the restart.
type Encoder interface {
	Encode(ctx context.Context, r *kafka.Record) error
}

// errEncode wraps an Encoder's error that restarts the session.
var errEncode = errors.New("encode record")

// encode applies the configured Encoder to r, the record of event m. A
// poison error comes back as the bad event to hand to badEvent.
func (p *Pipeline) encode(ctx context.Context, r *kafka.Record, m *replication.Message) (*replication.BadEvent, error) {
	if p.cfg.Encoder == nil {
		return nil, nil
	}
	err := p.cfg.Encoder.Encode(ctx, r)
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, kafka.ErrPoison):
		bad := eventBad(m, err.Error())
		return &bad, nil
	}
	return nil, fmt.Errorf("publisher: %w: outbox id %s: %w", errEncode, m.Event.IDString(), err)
}

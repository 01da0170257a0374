package poll

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// NewKafka is the poller that outboxd run --source=poll starts (and the
// bench measures in-process): every session sends with a kafka.Producer on
// kcfg, poison rows go to cfg.DeadLetterTopic when it is set (kcfg's
// ContinueAfterPoison follows it), and newHook, when set, is Deps.NewHook.
// log is named "poll" for the poller and "kafka" for its producer; m may be
// nil.
func NewKafka(cfg Config, kcfg kafka.Config, newHook func(context.Context) (outbox.Hook, error), log *zap.Logger, m *Metrics) (*Poller, error) {
	kcfg.ContinueAfterPoison = cfg.DeadLetterTopic != ""
	deps := Deps{
		NewProducer: func() (outbox.Producer, error) {
			return kafka.NewProducer(kcfg, log.Named("kafka"), kafka.ProducerHooks{})
		},
		NewHook: newHook,
	}
	if topic := cfg.DeadLetterTopic; topic != "" {
		deps.NewDeadLetterer = func() (outbox.DeadLetterer, error) {
			return kafka.NewDeadLetterer(kcfg, topic)
		}
	}
	return New(cfg, log.Named("poll"), m, deps)
}

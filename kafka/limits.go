package kafka

import (
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// brokerLimits reads message.max.bytes (the largest record batch a broker
// appends) and socket.request.max.bytes (the largest request it reads) of
// every known broker with DescribeConfigs, and returns the smallest of
// each; 0 for a limit no broker told. A topic's own max.message.bytes is
// not read: a batch it refuses is split, and a record it refuses alone is
// a poison event.
func brokerLimits(client sarama.Client, conf *sarama.Config) (message, request int, err error) {
	for _, b := range client.Brokers() {
		if ok, _ := b.Connected(); !ok {
			if err := b.Open(conf); err != nil && err != sarama.ErrAlreadyConnected {
				return 0, 0, err
			}
		}
		resp, err := b.DescribeConfigs(&sarama.DescribeConfigsRequest{
			Version: 4,
			Resources: []*sarama.ConfigResource{{
				Type:        sarama.BrokerResource,
				Name:        strconv.Itoa(int(b.ID())),
				ConfigNames: []string{"message.max.bytes", "socket.request.max.bytes"},
			}},
		})
		if err != nil {
			return 0, 0, fmt.Errorf("describe configs of broker %d: %w", b.ID(), err)
		}
		for _, r := range resp.Resources {
			if r.ErrorCode != 0 {
				return 0, 0, fmt.Errorf("describe configs of broker %d: %s (%d)", b.ID(), r.ErrorMsg, r.ErrorCode)
			}
			for _, c := range r.Configs {
				v, err := strconv.Atoi(c.Value)
				if err != nil || v <= 0 {
					continue
				}
				switch c.Name {
				case "message.max.bytes":
					message = minPositive(message, v)
				case "socket.request.max.bytes":
					request = minPositive(request, v)
				}
			}
		}
	}
	return message, request, nil
}

func minPositive(a, b int) int {
	if a == 0 || b < a {
		return b
	}
	return a
}

// fitBroker lowers cfg's MaxMessageBytes and MaxRequestBytes to what the
// brokers accept, so that a produce request never exceeds the broker's
// limits. When the brokers cannot say (no DescribeConfigs permission), the
// configured values stand.
func fitBroker(cfg *Config, client sarama.Client, conf *sarama.Config, log *zap.Logger) {
	msg, req, err := brokerLimits(client, conf)
	if err != nil {
		log.Info("could not read the brokers' message.max.bytes and socket.request.max.bytes; using --kafka-max-message-bytes and --kafka-max-request-bytes",
			zap.Error(err))
		return
	}
	if msg > 0 && msg < cfg.MaxMessageBytes {
		log.Info("the brokers' message.max.bytes is below --kafka-max-message-bytes: using it",
			zap.Int("message_max_bytes", msg), zap.Int("configured", cfg.MaxMessageBytes))
		cfg.MaxMessageBytes = msg
	}
	if req > 0 && req < cfg.MaxRequestBytes {
		log.Info("the brokers' socket.request.max.bytes is below --kafka-max-request-bytes: using it",
			zap.Int("socket_request_max_bytes", req), zap.Int("configured", cfg.MaxRequestBytes))
		cfg.MaxRequestBytes = req
	}
}

// requestOverhead bounds a produce request's framing besides its batches
// (header, transactional id, topic and partition entries).
const requestOverhead = 1024

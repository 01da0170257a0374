package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// SASLKafkaServer is a private single-node Kafka that also has a
// SASL_PLAINTEXT listener accepting PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
// for one user (dev/stack kafka-init --sasl). Its PLAINTEXT listener
// (Brokers) stays open for admin work such as creating topics.
type SASLKafkaServer struct {
	*KafkaServer
	SASLBrokers []string // 127.0.0.1:SASLPort
	SASLPort    int
	User        string
	Password    string // random, made at init
}

// StartKafkaSASL formats and starts a private Kafka with a SASL listener in a
// temporary folder; it is killed and removed at cleanup.
func StartKafkaSASL(t testing.TB) *SASLKafkaServer {
	t.Helper()
	dir := instanceDir(t, "outboxd-kafka-sasl-")
	ports := freePorts(t, 3)
	s := &SASLKafkaServer{
		KafkaServer: &KafkaServer{
			Brokers: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])},
			Dir:     dir,
			Port:    ports[0],
			t:       t,
		},
		SASLBrokers: []string{fmt.Sprintf("127.0.0.1:%d", ports[2])},
		SASLPort:    ports[2],
	}
	t.Cleanup(func() {
		if err := stack("kafka-stop", dir, "kill"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := stack("kafka-init", dir, strconv.Itoa(ports[0]), strconv.Itoa(ports[1]), "--sasl", strconv.Itoa(ports[2])); err != nil {
		unavailable(t, hintPrivate, "cannot create a private Kafka with SASL: %v", err)
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"sasl.user", &s.User}, {"sasl.password", &s.Password}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		*f.dst = strings.TrimSpace(string(b))
	}
	s.Start()
	return s
}

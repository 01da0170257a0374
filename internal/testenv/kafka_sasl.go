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
// for one user, and a SASL_SSL listener that in addition requires a client
// certificate (dev/stack kafka-init --sasl --tls). Its PLAINTEXT listener
// (Brokers) stays open for admin work such as creating topics.
type SASLKafkaServer struct {
	*KafkaServer
	SASLBrokers []string // 127.0.0.1:SASLPort, SASL_PLAINTEXT
	SASLPort    int
	TLSBrokers  []string // 127.0.0.1:TLSPort, SASL_SSL with client certificates
	TLSPort     int
	User        string
	Password    string // random, made at init
	// PEM files of the throwaway CA that signed the broker's certificate
	// (for 127.0.0.1 and localhost), and of a client certificate it accepts.
	CAFile, ClientCertFile, ClientKeyFile string
}

// StartKafkaSASL formats and starts a private Kafka with the SASL and TLS
// listeners in a temporary folder; it is killed and removed at cleanup.
func StartKafkaSASL(t testing.TB) *SASLKafkaServer {
	t.Helper()
	return startKafkaSASL(t, nil)
}

// StartKafkaSASLACL is StartKafkaSASL with Kafka's StandardAuthorizer on:
// the SASL user may do only what ACLs allow (none at first), while the
// PLAINTEXT listener's principal (User:ANONYMOUS, also used between broker
// and controller) is a super user, so Brokers serves as the admin client
// that grants ACLs.
func StartKafkaSASLACL(t testing.TB) *SASLKafkaServer {
	t.Helper()
	return startKafkaSASL(t, map[string]string{
		"authorizer.class.name":          "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
		"super.users":                    "User:ANONYMOUS",
		"allow.everyone.if.no.acl.found": "false",
	})
}

func startKafkaSASL(t testing.TB, props map[string]string) *SASLKafkaServer {
	t.Helper()
	dir := instanceDir(t, "outboxd-kafka-sasl-")
	ports := freePorts(t, 4)
	s := &SASLKafkaServer{
		KafkaServer: &KafkaServer{
			Brokers: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])},
			Dir:     dir,
			Port:    ports[0],
			t:       t,
		},
		SASLBrokers:    []string{fmt.Sprintf("127.0.0.1:%d", ports[2])},
		SASLPort:       ports[2],
		TLSBrokers:     []string{fmt.Sprintf("127.0.0.1:%d", ports[3])},
		TLSPort:        ports[3],
		CAFile:         filepath.Join(dir, "tls", "ca.pem"),
		ClientCertFile: filepath.Join(dir, "tls", "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "tls", "client-key.pem"),
	}
	t.Cleanup(func() {
		if err := stack("kafka-stop", dir, "kill"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := stack("kafka-init", dir, strconv.Itoa(ports[0]), strconv.Itoa(ports[1]),
		"--sasl", strconv.Itoa(ports[2]), "--tls", strconv.Itoa(ports[3])); err != nil {
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
	if err := appendProperties(filepath.Join(dir, "server.properties"), props); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s.Start()
	return s
}

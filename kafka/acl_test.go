package kafka

import (
	"errors"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
)

// With Kafka's StandardAuthorizer and a SASL user lacking an ACL, outboxd
// says in one line which ACL is missing and how to grant it: CREATE on the
// checkpoint topic, WRITE on the transactional id.
func TestKafkaMissingACLsAreNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	t.Parallel()
	ks := testenv.StartKafkaSASLACL(t)
	admin, err := sarama.NewClusterAdmin(ks.Brokers, (&testenv.KafkaEnv{Brokers: ks.Brokers}).Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	user := "User:" + ks.User
	allow := func(rt sarama.AclResourceType, name string, op sarama.AclOperation) {
		t.Helper()
		err := admin.CreateACLs([]*sarama.ResourceAcls{{
			Resource: sarama.Resource{ResourceType: rt, ResourceName: name, ResourcePatternType: sarama.AclPatternLiteral},
			Acls:     []*sarama.Acl{{Principal: user, Host: "*", Operation: op, PermissionType: sarama.AclPermissionAllow}},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Enough to connect and look around, not to create topics or write.
	allow(sarama.AclResourceCluster, "kafka-cluster", sarama.AclOperationDescribe)
	allow(sarama.AclResourceTopic, "*", sarama.AclOperationDescribe)
	allow(sarama.AclResourceTransactionalID, "*", sarama.AclOperationDescribe)

	cfg := DefaultConfig()
	cfg.Brokers = ks.SASLBrokers
	cfg.Security = Security{SASLMechanism: sarama.SASLTypePlaintext, SASLUser: ks.User, SASLPassword: ks.Password}

	err = EnsureCompactedTopic(cfg, "outboxd.checkpoints")
	checkACLError(t, err, "Create", "--allow-principal User:"+ks.User+" --operation Create --topic outboxd.checkpoints")

	cfg.TransactionalID = "outboxd-acl"
	_, err = NewProducer(cfg, zaptest.NewLogger(t), ProducerHooks{})
	checkACLError(t, err, "Write", "--allow-principal User:"+ks.User+" --operation Write --transactional-id outboxd-acl")
}

func checkACLError(t *testing.T, err error, op, grant string) {
	t.Helper()
	var acl *ACLError
	if !errors.As(err, &acl) || !errors.Is(err, ErrNotAuthorized) || acl.Operation != op {
		t.Fatalf("%v: want an ACLError for %s", err, op)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "kafka-acls.sh") || !strings.Contains(msg, grant) {
		t.Fatalf("%q: want one line with the kafka-acls.sh command (%s)", msg, grant)
	}
	t.Log(err)
}

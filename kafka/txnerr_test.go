package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The coordinator's answers after an idle transactional id expired
// (INVALID_PRODUCER_ID_MAPPING) or a transaction timed out
// (INVALID_PRODUCER_EPOCH, KIP-588) mean "start again", not "another
// producer took over": only PRODUCER_FENCED is a fencing. A transaction
// that outlived the timeout is a halt naming --kafka-txn-timeout.
func TestKafkaTxnErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		err        error
		openFor    time.Duration
		want, not  error
		wantInText string
	}{
		{sarama.ErrProducerFenced, 0, ErrFenced, ErrTxnLost, "fenced"},
		{sarama.ErrInvalidProducerIDMapping, 0, ErrTxnLost, ErrFenced, "restarting"},
		{sarama.ErrInvalidProducerEpoch, time.Second, ErrTxnLost, ErrFenced, "restarting"},
		{sarama.ErrInvalidProducerEpoch, 2 * time.Minute, ErrTxnTimeout, ErrFenced, "--kafka-txn-timeout"},
		// After a timeout abort EndTxn and AddPartitions answer
		// PRODUCER_FENCED (the coordinator bumped the epoch): the timeout
		// is the cause, not another outboxd.
		{sarama.ErrProducerFenced, 2 * time.Minute, ErrTxnTimeout, ErrFenced, "--kafka-txn-timeout"},
		{sarama.ErrTransactionalIDAuthorizationFailed, 0, ErrNotAuthorized, ErrFenced, "--operation Write --transactional-id tx-1"},
	} {
		t.Run(fmt.Sprintf("%v/open=%s", tc.err, tc.openFor), func(t *testing.T) {
			p := &Producer{cfg: Config{TransactionalID: "tx-1", TransactionTimeout: time.Minute}}
			if tc.openFor > 0 {
				p.txnOpened.Store(time.Now().Add(-tc.openFor).UnixNano())
			}
			got := p.classifyTxnErr(fmt.Errorf("add partitions: %w", tc.err))
			if !errors.Is(got, tc.want) || errors.Is(got, tc.not) || !errors.Is(got, tc.err) {
				t.Fatalf("%v: got %v, want %v and not %v", tc.err, got, tc.want, tc.not)
			}
			if !strings.Contains(got.Error(), tc.wantInText) {
				t.Fatalf("message %q does not say %q", got, tc.wantInText)
			}
		})
	}
}

// Past its timeout, a transaction Kafka's failures made late restarts: it
// would have fit without the longest time one of its requests kept failing
// (a leader or the coordinator away). One that would not have fit is too
// large for the timeout — a short retry does not change that — and halts.
func TestKafkaTxnTimeoutAfterAnOutageRestarts(t *testing.T) {
	for _, tc := range []struct {
		open, failing time.Duration
		want, not     error
		wantInText    string
	}{
		{2 * time.Minute, 90 * time.Second, ErrTxnLost, ErrTxnTimeout, "kept failing a request for 1m30s"},
		{70 * time.Second, 20 * time.Second, ErrTxnLost, ErrTxnTimeout, "kept failing a request for 20s"},
		{2 * time.Minute, 10 * time.Second, ErrTxnTimeout, ErrFenced, "--kafka-txn-timeout"},
		{2 * time.Minute, 0, ErrTxnTimeout, ErrFenced, "--kafka-txn-timeout"},
	} {
		for _, kerr := range []error{sarama.ErrProducerFenced, sarama.ErrInvalidProducerEpoch} {
			t.Run(fmt.Sprintf("open=%s/failing=%s/%v", tc.open, tc.failing, kerr), func(t *testing.T) {
				p := &Producer{cfg: Config{TransactionalID: "tx-1", TransactionTimeout: time.Minute}}
				p.txnOpened.Store(time.Now().Add(-tc.open).UnixNano())
				p.noteTxnFailing(tc.failing / 2)
				p.noteTxnFailing(tc.failing) // the longest counts
				got := p.classifyTxnErr(fmt.Errorf("commit transaction: %w", kerr))
				if !errors.Is(got, tc.want) || errors.Is(got, tc.not) || !errors.Is(got, kerr) {
					t.Fatalf("got %v, want %v and not %v", got, tc.want, tc.not)
				}
				if !strings.Contains(got.Error(), tc.wantInText) {
					t.Fatalf("message %q does not say %q", got, tc.wantInText)
				}
			})
		}
	}
}

// End to end on the fake broker: the coordinator forgets the transactional
// id (AddPartitionsToTxn answers INVALID_PRODUCER_ID_MAPPING): the records
// and the commit fail with ErrTxnLost, which restarts the session, and the
// abort a session makes on its way out is not taken for a fencing.
func TestKafkaProducerExpiredTransactionalIDIsNotFenced(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	f.c.ControlKey(int16(kmsg.AddPartitionsToTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.AddPartitionsToTxnRequest)
		resp := req.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
		for _, rt := range req.Topics {
			t := kmsg.NewAddPartitionsToTxnResponseTopic()
			t.Topic = rt.Topic
			for _, part := range rt.Partitions {
				pp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
				pp.Partition = part
				pp.ErrorCode = 49 // INVALID_PRODUCER_ID_MAPPING
				t.Partitions = append(t.Partitions, pp)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
	p := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-x"))
	sendAll(t, p, rec(1, "t", "a"))
	r := results(t, p, 1)[0]
	if !errors.Is(r.Err, ErrProduce) || errors.Is(r.Err, ErrFenced) {
		t.Fatalf("record: %v, want a produce error (restart), not fenced", r.Err)
	}
	if err := p.Commit(context.Background()); !errors.Is(err, ErrTxnLost) || errors.Is(err, ErrFenced) {
		t.Fatalf("Commit: %v, want ErrTxnLost and not fenced", err)
	}
	if err := p.Abort(context.Background()); errors.Is(err, ErrFenced) {
		t.Fatalf("Abort: %v, taken for a fencing", err)
	}
	if err := p.Abort(context.Background()); errors.Is(err, ErrFenced) {
		t.Fatalf("Abort: %v, taken for a fencing", err)
	}
}

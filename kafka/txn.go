package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/halt"
)

// Transactions (Config.TransactionalID set).
//
// A transactional Producer speaks Kafka's original transaction protocol
// (KIP-98), which Kafka 4 brokers still accept: InitProducerId with the
// transactional id when the producer is made (this fences every older
// producer with the same id and aborts its open transaction),
// AddPartitionsToTxn before the first batch of a transaction to a partition,
// transactional batches, and EndTxn. Records sent between two Commit calls
// form one transaction. The rules of the ordered producer still hold, and a
// record that fails for good fails the transaction: Commit then returns an
// error and the caller must close the producer (a new one aborts what was
// written). Consumers see the records only once committed, when they read
// read_committed.

// ErrFenced means another producer with the same transactional id took over
// (PRODUCER_FENCED): this process is a zombie and must stop without
// confirming anything.
var ErrFenced = halt.New("kafka: fenced by a newer producer with the same transactional id")

// ErrTxnFailed means a record of the transaction failed: it cannot commit.
var ErrTxnFailed = errors.New("kafka: transaction failed")

// ErrTxnLost means the transaction coordinator no longer knows this
// producer's transaction: the transactional id expired while idle
// (transactional.id.expiration.ms, INVALID_PRODUCER_ID_MAPPING) or the
// coordinator aborted the transaction when it outlived its timeout and
// bumped the epoch (KIP-588, INVALID_PRODUCER_EPOCH). Nothing of the
// transaction is visible; a new session (a new InitProducerId) publishes it
// again. It is not a fencing: no other producer took over.
var ErrTxnLost = errors.New("kafka: the transaction coordinator dropped this producer's transaction (idle transactional id expired, or the transaction timed out); restarting the session")

// ErrTxnTimeout means a Kafka transaction stayed open for the whole
// --kafka-txn-timeout and the coordinator aborted it. outboxd never splits a
// PostgreSQL transaction across Kafka transactions, and it closes its Kafka
// transactions at the first PostgreSQL commit after --kafka-txn-max-age, so
// this happens only when what must be published atomically takes longer than
// the timeout: publishing it again would time out again. The service halts.
var ErrTxnTimeout = halt.New("kafka: transaction timed out")

// TxnTimeoutError is ErrTxnTimeout with what is needed to fix it.
type TxnTimeoutError struct {
	Open, Timeout time.Duration
	Err           error
}

func (e *TxnTimeoutError) Error() string {
	return fmt.Sprintf("kafka: a transaction was open for %s, longer than --kafka-txn-timeout=%s, and the coordinator aborted it: "+
		"a PostgreSQL transaction too large to publish within one Kafka transaction (outboxd never splits one); "+
		"raise --kafka-txn-timeout (at most the brokers' transaction.max.timeout.ms, 15m by default) and restart: %v", e.Open.Round(time.Millisecond), e.Timeout, e.Err)
}

// Unwrap matches ErrTxnTimeout and the cause.
func (e *TxnTimeoutError) Unwrap() []error { return []error{ErrTxnTimeout, e.Err} }

// classifyTxnErr gives a transactional producer's error its meaning:
// fenced (stop for good), lost (restart), timed out (halt), or not
// authorised (the ACL to grant).
func (p *Producer) classifyTxnErr(err error) error {
	if p.cfg.TransactionalID == "" || errors.Is(err, ErrFenced) || errors.Is(err, ErrTxnLost) {
		return err
	}
	epochErr := errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch) ||
		errors.Is(err, sarama.ErrInvalidProducerIDMapping)
	// A transaction open past its timeout was aborted by the coordinator,
	// which bumped the epoch: whichever of the three answers follows
	// (EndTxn and AddPartitions say PRODUCER_FENCED), the cause is the
	// timeout, not another outboxd. Was it Kafka's failures that made it
	// late? If the transaction fits its timeout without the longest time
	// one of its requests kept failing (a leader or the coordinator away,
	// not enough replicas), the outage did: a restart publishes it once
	// Kafka is back. Otherwise what it held was too large to publish within
	// the timeout, and would be again: a halt. So a restart happens only
	// after a failure long enough to matter, never in a loop.
	if open := p.txnAge(); epochErr && open >= p.cfg.TransactionTimeout {
		if failing := time.Duration(p.txnFailing.Load()); open-failing < p.cfg.TransactionTimeout {
			return fmt.Errorf("%w: the transaction outlived --kafka-txn-timeout=%s (open %s) because Kafka kept failing a request for %s: %w",
				ErrTxnLost, p.cfg.TransactionTimeout, open.Round(time.Millisecond), failing.Round(time.Millisecond), err)
		}
		return &TxnTimeoutError{Open: open, Timeout: p.cfg.TransactionTimeout, Err: fmt.Errorf("%w: %w", ErrTxnLost, err)}
	}
	switch {
	case errors.Is(err, sarama.ErrProducerFenced):
		return fmt.Errorf("%w: %w", ErrFenced, err)
	case errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed):
		return &ACLError{Operation: "Write", ResourceType: "transactional-id", Resource: p.cfg.TransactionalID, Principal: p.cfg.Security.SASLUser, Err: err}
	case epochErr:
		return fmt.Errorf("%w: %w", ErrTxnLost, err)
	}
	return err
}

// noteTxnFailing records that a request of the current transaction has
// been failing for d (see txnFailing).
func (p *Producer) noteTxnFailing(d time.Duration) {
	for {
		cur := p.txnFailing.Load()
		if int64(d) <= cur || p.txnFailing.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// txnAge is how long the current transaction has been open (zero: none).
func (p *Producer) txnAge() time.Duration {
	opened := p.txnOpened.Load()
	if opened == 0 {
		return 0
	}
	return time.Since(time.Unix(0, opened))
}

// coordinatorRetriable are the errors after which a transaction request to
// the coordinator is sent again (after refreshing the coordinator).
func coordinatorRetriable(err error) bool {
	var kerr sarama.KError
	if !errors.As(err, &kerr) {
		return true // a transport error: the coordinator may have moved
	}
	switch kerr {
	case sarama.ErrConcurrentTransactions, sarama.ErrOffsetsLoadInProgress, sarama.ErrNotCoordinatorForConsumer,
		sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrRequestTimedOut, sarama.ErrNetworkException,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrKafkaStorageError:
		return true
	}
	return false
}

// txnVersions are the request versions for the protocol version spoken.
func txnVersions(v sarama.KafkaVersion) (initPID, addParts, endTxn int16) {
	switch {
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 4, 3, 3
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 4, 2, 2
	default:
		return 1, 1, 1
	}
}

// coordinatorCall runs fn against the transaction coordinator, refreshing it
// and retrying with backoff on retriable errors, until deadline.
func (p *Producer) coordinatorCall(what string, deadline time.Time, fn func(*sarama.Broker) error) error {
	began := time.Now()
	for attempt := 1; ; attempt++ {
		var err error
		b, cerr := p.client.TransactionCoordinator(p.cfg.TransactionalID)
		if cerr != nil {
			err = cerr
		} else {
			err = fn(b)
		}
		classified := err
		if err != nil {
			classified = p.classifyTxnErr(err)
		}
		switch {
		case err == nil:
			return nil
		case classified != err:
			return fmt.Errorf("%s: %w", what, classified)
		case !coordinatorRetriable(err) || time.Now().After(deadline):
			return fmt.Errorf("%s: %w", what, err)
		}
		if errors.Is(err, sarama.ErrConcurrentTransactions) {
			// The previous transaction's markers are still being written:
			// the usual case for the first AddPartitionsToTxn after a commit,
			// over in a millisecond or two. Retry soon, and quietly.
			if attempt%50 == 0 {
				p.log.Warn("kafka transaction coordinator still busy with the previous transaction; retrying",
					zap.String("request", what), zap.Int("attempt", attempt))
			}
			time.Sleep(backoff.Exponential(time.Millisecond, p.cfg.RetryBackoffMax, attempt))
			continue
		}
		p.noteTxnFailing(time.Since(began))
		if attempt == 1 || attempt%10 == 0 {
			p.log.Warn("kafka transaction coordinator request failed; retrying", zap.String("request", what),
				zap.Int("attempt", attempt), zap.Error(err))
		}
		_ = p.client.RefreshTransactionCoordinator(p.cfg.TransactionalID)
		time.Sleep(backoff.Jitter(backoff.Exponential(p.cfg.RetryBackoff, p.cfg.RetryBackoffMax, attempt)))
	}
}

// initTransactional gets the producer id and epoch for the transactional id:
// every older producer with that id is fenced and its open transaction
// aborted. Right after a fence the coordinator answers
// CONCURRENT_TRANSACTIONS until the abort is complete: retried.
func (p *Producer) initTransactional() error {
	initV, _, _ := txnVersions(p.conf.Version)
	return p.coordinatorCall("init producer id", time.Now().Add(p.cfg.DeliveryTimeout), func(b *sarama.Broker) error {
		id := p.cfg.TransactionalID
		resp, err := b.InitProducerID(&sarama.InitProducerIDRequest{
			Version: initV, TransactionalID: &id, TransactionTimeout: p.cfg.TransactionTimeout,
			ProducerID: -1, ProducerEpoch: -1,
		})
		if err != nil {
			return err
		}
		if errors.Is(resp.Err, sarama.ErrInvalidTransactionTimeout) {
			return fmt.Errorf("--kafka-txn-timeout=%s is above the brokers' transaction.max.timeout.ms: lower it, or raise that broker setting: %w", p.cfg.TransactionTimeout, resp.Err)
		}
		if !errors.Is(resp.Err, sarama.ErrNoError) {
			return resp.Err
		}
		p.pid, p.epoch = resp.ProducerID, resp.ProducerEpoch
		return nil
	})
}

// addPartitions registers partitions with the current transaction.
func (p *Producer) addPartitions(parts map[string][]int32) error {
	_, addV, _ := txnVersions(p.conf.Version)
	return p.coordinatorCall("add partitions to transaction", time.Now().Add(p.cfg.DeliveryTimeout), func(b *sarama.Broker) error {
		resp, err := b.AddPartitionsToTxn(&sarama.AddPartitionsToTxnRequest{
			Version: addV, TransactionalID: p.cfg.TransactionalID, ProducerID: p.pid, ProducerEpoch: p.epoch,
			TopicPartitions: parts,
		})
		if err != nil {
			return err
		}
		for _, pes := range resp.Errors {
			for _, pe := range pes {
				if !errors.Is(pe.Err, sarama.ErrNoError) {
					return pe.Err
				}
			}
		}
		return nil
	})
}

// endTxn commits or aborts the current transaction. A retry of an EndTxn
// that the coordinator already completed is answered with success.
func (p *Producer) endTxn(commit bool) error {
	_, _, endV := txnVersions(p.conf.Version)
	what := "commit transaction"
	if !commit {
		what = "abort transaction"
	}
	return p.coordinatorCall(what, time.Now().Add(p.cfg.DeliveryTimeout), func(b *sarama.Broker) error {
		resp, err := b.EndTxn(&sarama.EndTxnRequest{
			Version: endV, TransactionalID: p.cfg.TransactionalID, ProducerID: p.pid, ProducerEpoch: p.epoch,
			TransactionResult: commit,
		})
		if err != nil {
			return err
		}
		if !commit && errors.Is(resp.Err, sarama.ErrInvalidTxnState) {
			return nil // no transaction open: nothing to abort
		}
		if !errors.Is(resp.Err, sarama.ErrNoError) {
			return resp.Err
		}
		return nil
	})
}

// txnRequest asks the run loop to end the transaction.
type txnRequest struct {
	commit bool
	done   chan error
}

// txnState is the run loop's view of the current transaction.
type txnState struct {
	added   map[topicPartition]bool // partitions registered with the coordinator
	adding  bool                    // an AddPartitionsToTxn in flight
	failed  error                   // a record of this transaction failed
	ending  *txnRequest             // Commit or Abort waiting for the records
	endBusy bool                    // EndTxn in flight
}

type topicPartition struct {
	topic     string
	partition int32
}

// addResult is an AddPartitionsToTxn outcome, back on the run loop.
type addResult struct {
	parts []topicPartition
	err   error
}

// Commit commits the records sent since the last Commit, after every one of
// them was acknowledged, and returns once the coordinator confirmed it. It
// returns an error wrapping ErrTxnFailed when a record failed (the records
// came back with their errors), ErrFenced when a newer producer took over,
// or the coordinator's error: in every case the transaction did not commit
// (or its outcome is unknown) and the producer must be closed. Send must not
// be called while Commit runs. Only for a transactional producer.
func (p *Producer) Commit(ctx context.Context) error { return p.endTxnRequest(ctx, true) }

// Abort aborts the records sent since the last Commit. It asks the
// coordinator even when nothing was sent, so it returns ErrFenced when a
// newer producer with the same transactional id took over.
func (p *Producer) Abort(ctx context.Context) error { return p.endTxnRequest(ctx, false) }

func (p *Producer) endTxnRequest(ctx context.Context, commit bool) error {
	if p.cfg.TransactionalID == "" {
		return errors.New("kafka: Commit and Abort need Config.TransactionalID")
	}
	req := &txnRequest{commit: commit, done: make(chan error, 1)}
	select {
	case p.txnCtl <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closing:
		return ErrProducerClosed
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// txnPartitionReady reports whether rb may be sent in the current
// transaction, and registers it when not yet.
func (p *Producer) txnPartitionReady(rb *recBuf, needAdd map[topicPartition]bool) bool {
	if p.cfg.TransactionalID == "" {
		return true
	}
	tp := topicPartition{rb.topic.name, rb.partition}
	if p.txn.added[tp] {
		return true
	}
	needAdd[tp] = true
	return false
}

// startAdd registers the partitions that need it, one request at a time.
func (p *Producer) startAdd(needAdd map[topicPartition]bool) {
	if len(needAdd) == 0 || p.txn.adding || p.txn.failed != nil {
		return
	}
	p.txn.adding = true
	if len(p.txn.added) == 0 {
		p.txnOpened.CompareAndSwap(0, time.Now().UnixNano())
	}
	parts := make([]topicPartition, 0, len(needAdd))
	req := map[string][]int32{}
	for tp := range needAdd {
		parts = append(parts, tp)
		req[tp.topic] = append(req[tp.topic], tp.partition)
	}
	p.spawn(func() {
		err := p.addPartitions(req)
		select {
		case p.added <- addResult{parts: parts, err: err}:
		case <-p.stopped:
		}
	})
}

func (p *Producer) handleAdded(r addResult) {
	p.txn.adding = false
	if r.err != nil {
		p.log.Error("kafka: add partitions to transaction failed: failing the transaction", zap.Error(r.err))
		p.failTxn(r.err)
		return
	}
	for _, tp := range r.parts {
		p.txn.added[tp] = true
	}
}

// failTxn fails every record of the transaction not yet sent.
func (p *Producer) failTxn(err error) {
	if p.txn.failed == nil {
		p.txn.failed = err
	}
	for _, t := range p.topics {
		for _, rb := range t.parts {
			rb.stop(p, err) // a batch in flight is settled by its response
		}
	}
}

// maybeEndTxn ends the transaction once every record came back.
func (p *Producer) maybeEndTxn() {
	req := p.txn.ending
	if req == nil || p.txn.endBusy || p.outstanding > 0 || p.txn.adding {
		return
	}
	if p.txn.failed != nil {
		p.txn.ending = nil
		req.done <- fmt.Errorf("%w: %w", ErrTxnFailed, p.txn.failed)
		return
	}
	if len(p.txn.added) == 0 && req.commit {
		// Nothing was written: there is nothing to commit. (An abort still
		// asks the coordinator: it answers a fenced producer so, which is
		// how a zombie learns it.)
		p.txn.ending = nil
		req.done <- nil
		return
	}
	p.txn.endBusy = true
	p.spawn(func() {
		err := p.endTxn(req.commit)
		select {
		case p.ended <- err:
		case <-p.stopped:
		}
	})
}

func (p *Producer) handleEnded(err error) {
	req := p.txn.ending
	p.txn.ending, p.txn.endBusy = nil, false
	if err == nil {
		p.txn.added = map[topicPartition]bool{}
		p.txnOpened.Store(0)
		p.txnFailing.Store(0)
	} else {
		p.txn.failed = err // the outcome is unknown: this producer is done
	}
	req.done <- err
}

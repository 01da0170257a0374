package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
)

// validateRun checks everything about `outboxd run`'s settings that can be
// known without connecting anywhere. run and `config check` call it alike,
// so that a configuration config check calls valid is one run accepts.
// It returns the Kafka configuration the settings make.
func (o *options) validateRun() (kafka.Config, error) {
	kcfg, kerr := o.kafkaConfig()
	_, herr := outbox.ParseHooks(o.hooks)
	_, lerr := o.logger(io.Discard)
	serr := o.shape()
	_, ferr := o.formats.config(o) // after shape: it checks the encodings
	errs := []error{o.validateCommon(), o.validateDSN(), kerr, validateBrokers(kcfg.Brokers),
		serr, ferr, o.pub.Validate(), o.streamConfig().Validate(), herr, lerr, o.validateCombinations()}
	if o.poll.source == sourcePoll {
		_, perr := o.pollConfig()
		errs = append(errs, perr)
	}
	if err := joinDistinct(errs...); err != nil {
		return kcfg, fmt.Errorf("invalid configuration: %w", err)
	}
	return kcfg, nil
}

// joinDistinct is errors.Join without repeating a line: the publisher's and
// the poller's Validate share some rules (shutdown timeout, backoff, the
// dead-letter topic), and --source=poll checks both.
func joinDistinct(errs ...error) error {
	seen := map[string]bool{}
	var out []error
	for _, err := range errs {
		if err == nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			if !seen[l] {
				seen[l] = true
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			out = append(out, &joinedLines{err: err, text: strings.Join(lines, "\n")})
		}
	}
	return errors.Join(out...)
}

// joinedLines is an error shown as text (its new lines only), matching err.
type joinedLines struct {
	err  error
	text string
}

func (e *joinedLines) Error() string { return e.text }
func (e *joinedLines) Unwrap() error { return e.err }

// validateDSN parses --pg-dsn as run would, with a message that names the
// problem without quoting a password.
func (o *options) validateDSN() error {
	dsn := strings.TrimSpace(o.pgDSN)
	if dsn == "" {
		return nil // validateCommon says it
	}
	if i := strings.Index(dsn, "://"); i > 0 && !strings.ContainsAny(dsn[:i], " =") {
		scheme := dsn[:i]
		if scheme != "postgres" && scheme != "postgresql" {
			return fmt.Errorf("--pg-dsn: a %s:// URL is not a PostgreSQL connection string: use postgres://user@host:5432/dbname or 'host=... dbname=...'", scheme)
		}
		if _, err := url.Parse(dsn); err != nil {
			return fmt.Errorf("--pg-dsn: not a valid URL (%s): check its quoting, e.g. a password with / or @ must be percent-encoded", redactURLError(err))
		}
	}
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		var perr *pgconn.ParseConfigError
		msg := "cannot be parsed"
		if errors.As(err, &perr) && perr.Unwrap() != nil {
			msg = redactURLError(perr.Unwrap())
		}
		return fmt.Errorf("--pg-dsn: %s: want postgres://user@host:5432/dbname or 'host=... port=5432 dbname=... user=...'", msg)
	}
	return nil
}

// redactURLError is an error's text without the URL the url package quotes
// (which can hold a password).
func redactURLError(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err.Error()
	}
	return err.Error()
}

// validateBrokers checks that every broker is host:port.
func validateBrokers(brokers []string) error {
	var errs []error
	for _, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			errs = append(errs, fmt.Errorf("--kafka-brokers: %q is not host:port (e.g. kafka-1:9092)", b))
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			errs = append(errs, fmt.Errorf("--kafka-brokers: %q: port %q is not a number from 1 to 65535", b, port))
		}
	}
	return errors.Join(errs...)
}

// validateCombinations refuses settings that contradict each other or would
// be ignored silently.
func (o *options) validateCombinations() error {
	var errs []error
	if o.poll.source == sourcePoll && o.pub.Delivery == publisher.ExactlyOnce {
		errs = append(errs, errors.New("--source=poll publishes at-least-once only: drop --delivery=exactly-once, or use --source=cdc"))
	}
	if o.retention.OlderThan < 0 {
		errs = append(errs, fmt.Errorf("--retention %s: must be positive (e.g. 168h), or 0 to keep every row", o.retention.OlderThan))
	}
	if o.retention.OlderThan > 0 && o.retention.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--retention-interval %s: must be > 0", o.retention.Interval))
	}
	// --source=poll checks these in poll.Config.Validate; otherwise they
	// are refused all the same, so that a file is valid for either source.
	if o.poll.source != sourcePoll && o.poll.workers < 1 {
		errs = append(errs, fmt.Errorf("--poll-workers %d: must be ≥ 1", o.poll.workers))
	}
	if o.poll.source != sourcePoll && o.poll.batchSize < 1 {
		errs = append(errs, fmt.Errorf("--poll-batch-size %d: must be ≥ 1", o.poll.batchSize))
	}
	if o.poll.source != sourcePoll && o.poll.interval <= 0 {
		errs = append(errs, fmt.Errorf("--poll-interval %s: must be > 0", o.poll.interval))
	}
	errs = append(errs, o.validateSettings()...)
	return errors.Join(errs...)
}

// validateSettings refuses values that cannot work, each named with the
// flag and what it takes: a zero interval (a ticker panics on it), a
// negative wait, a topic name Kafka refuses, two roles for one topic, a
// registry address without an http(s) scheme, a file that is not there.
func (o *options) validateSettings() []error {
	var errs []error
	positive := []struct {
		flag string
		d    time.Duration
	}{{"--slot-poll-interval", o.slotPoll}, {"--stall-timeout", o.stallTimeout}}
	for _, p := range positive {
		if p.d <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be > 0", p.flag, p.d))
		}
	}
	notNegative := []struct {
		flag string
		d    time.Duration
	}{{"--kafka-linger", o.linger}, {"--schema-cache-ttl", o.formats.cfg.CacheTTL}, {"--start-timeout", o.startTimeout}, {"--audit-interval", o.auditInterval}}
	for _, p := range notNegative {
		if p.d < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be ≥ 0", p.flag, p.d))
		}
	}
	if o.auditInterval > 0 && o.auditDelay <= 0 {
		errs = append(errs, fmt.Errorf("--audit-delay %s: must be > 0 with --audit-interval", o.auditDelay))
	}
	if o.auditInterval > 0 && o.pub.Mapping.IDHeader == "-" {
		errs = append(errs, fmt.Errorf("--audit-interval with --id-header -: records without an id cannot be matched to rows"))
	}
	topics := []struct{ flag, name string }{
		{"--checkpoint-topic", o.pub.CheckpointTopic}, {"--dead-letter-topic", o.pub.DeadLetterTopic}, {"--default-topic", o.pub.DefaultTopic},
	}
	for _, t := range topics {
		if t.name == "" {
			continue
		}
		if err := kafka.ValidateTopicName(t.name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.flag, err))
		}
	}
	if cp := o.pub.CheckpointTopic; cp != "" && (cp == o.pub.DeadLetterTopic || cp == o.pub.DefaultTopic) {
		errs = append(errs, fmt.Errorf("--checkpoint-topic %q is also the dead-letter or default topic: the checkpoint topic holds only outboxd's checkpoints; give it a topic of its own", cp))
	}
	if u := strings.TrimSpace(o.formats.registryURL); u != "" {
		for _, one := range strings.Split(u, ",") {
			pu, err := url.Parse(strings.TrimSpace(one))
			if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				errs = append(errs, fmt.Errorf("--schema-registry-url %q: want http://host:port or https://host:port", redactURLs(one)))
			}
		}
	}
	if f := o.formats.registryCAFile; f != "" {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("--schema-registry-ca-file: %w", err))
		}
	}
	return errs
}

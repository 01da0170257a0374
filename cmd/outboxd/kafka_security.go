package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/publisher"
)

// kafkaSecurity is how outboxd authenticates to Kafka and protects the
// connection: TLS (server verification against a CA, optional client
// certificate) and SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
type kafkaSecurity struct {
	TLS            bool
	CAFile         string
	CertFile       string
	KeyFile        string
	ServerName     string
	SASLMechanism  string
	SASLUser       string
	SASLPassword   string // secret
	SASLPassFile   string
	saslPassLoaded string // SASLPassword or the file's content
}

func addKafkaSecurityFlags(fs *flag.FlagSet, s *kafkaSecurity) {
	fs.BoolVar(&s.TLS, "kafka-tls", false, "connect to Kafka over TLS (implied by any other --kafka-tls-* flag)")
	fs.StringVar(&s.CAFile, "kafka-tls-ca-file", "", "PEM file of the CA certificates that verify the brokers (default: the system's)")
	fs.StringVar(&s.CertFile, "kafka-tls-cert-file", "", "PEM client certificate, for brokers that require one (with --kafka-tls-key-file)")
	fs.StringVar(&s.KeyFile, "kafka-tls-key-file", "", "PEM private key of --kafka-tls-cert-file")
	fs.StringVar(&s.ServerName, "kafka-tls-server-name", "", "name to verify the brokers' certificates against (default: the broker's host)")
	fs.StringVar(&s.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL")
	fs.StringVar(&s.SASLUser, "kafka-sasl-username", "", "SASL user name")
	fs.StringVar(&s.SASLPassword, "kafka-sasl-password", "", "SASL password (secret: prefer the environment or --kafka-sasl-password-file over the command line)")
	fs.StringVar(&s.SASLPassFile, "kafka-sasl-password-file", "", "file holding the SASL password (one line)")
}

var saslMechanisms = []string{sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512}

func (s *kafkaSecurity) tlsEnabled() bool {
	return s.TLS || s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.ServerName != ""
}

// validate checks the settings and reads the password file. It never quotes
// the password.
func (s *kafkaSecurity) validate() error {
	var errs []error
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("Kafka TLS: --kafka-tls-cert-file and --kafka-tls-key-file go together"))
	}
	s.SASLMechanism = strings.ToUpper(strings.TrimSpace(s.SASLMechanism))
	switch {
	case s.SASLMechanism == "":
		if s.SASLUser != "" || s.SASLPassword != "" || s.SASLPassFile != "" {
			errs = append(errs, errors.New("Kafka SASL: a user or password is set but no --kafka-sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"))
		}
	case !slices.Contains(saslMechanisms, s.SASLMechanism):
		errs = append(errs, fmt.Errorf("Kafka SASL: unknown mechanism %q: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.SASLMechanism))
	default:
		if s.SASLUser == "" {
			errs = append(errs, errors.New("Kafka SASL: --kafka-sasl-username is empty"))
		}
		switch {
		case s.SASLPassword != "" && s.SASLPassFile != "":
			errs = append(errs, errors.New("Kafka SASL: set --kafka-sasl-password or --kafka-sasl-password-file, not both"))
		case s.SASLPassFile != "":
			b, err := os.ReadFile(s.SASLPassFile)
			if err != nil {
				errs = append(errs, fmt.Errorf("Kafka SASL: read --kafka-sasl-password-file: %w", err))
			}
			s.saslPassLoaded = strings.TrimRight(string(b), "\r\n")
			if err == nil && s.saslPassLoaded == "" {
				errs = append(errs, fmt.Errorf("Kafka SASL: --kafka-sasl-password-file %s is empty", s.SASLPassFile))
			}
		case s.SASLPassword != "":
			s.saslPassLoaded = s.SASLPassword
		default:
			errs = append(errs, errors.New("Kafka SASL: no password: set OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file"))
		}
	}
	return errors.Join(errs...)
}

// tlsConfig loads the certificates.
func (s *kafkaSecurity) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("Kafka TLS: read --kafka-tls-ca-file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("Kafka TLS: --kafka-tls-ca-file %s holds no PEM certificate", s.CAFile)
		}
	}
	if s.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("Kafka TLS: load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// configure returns the function that applies the settings to a sarama
// configuration (publisher.KafkaConfig.Configure). Call validate first.
func (s *kafkaSecurity) configure() (func(*sarama.Config), error) {
	var tc *tls.Config
	if s.tlsEnabled() {
		var err error
		if tc, err = s.tlsConfig(); err != nil {
			return nil, err
		}
	}
	mech, user, pass := s.SASLMechanism, s.SASLUser, s.saslPassLoaded
	return func(c *sarama.Config) {
		if tc != nil {
			c.Net.TLS.Enable = true
			c.Net.TLS.Config = tc.Clone()
		}
		if mech == "" {
			return
		}
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.Mechanism = sarama.SASLMechanism(mech)
		c.Net.SASL.User = user
		c.Net.SASL.Password = pass
		switch mech {
		case sarama.SASLTypeSCRAMSHA256:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
		case sarama.SASLTypeSCRAMSHA512:
			c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
		}
	}, nil
}

// describe is the security setup in a few words, for the startup log.
func (s *kafkaSecurity) describe() string {
	var parts []string
	if s.tlsEnabled() {
		parts = append(parts, "TLS")
	}
	if s.SASLMechanism != "" {
		parts = append(parts, fmt.Sprintf("SASL %s as %q", s.SASLMechanism, s.SASLUser))
	}
	if len(parts) == 0 {
		return "plaintext, no authentication"
	}
	return strings.Join(parts, ", ")
}

// scramClient is sarama's SCRAMClient on top of xdg-go/scram, as in sarama's
// own SASL/SCRAM example.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	client, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = client.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }

// KafkaAuthError is a Kafka connection that failed for a reason a retry
// cannot fix: authentication or TLS verification.
type KafkaAuthError struct {
	Msg string
	Err error
}

func (e *KafkaAuthError) Error() string { return e.Msg + ": " + e.Err.Error() }
func (e *KafkaAuthError) Unwrap() error { return e.Err }

// checkKafka connects to the brokers once with the producer's settings. A
// failed authentication or TLS verification is returned as a
// *KafkaAuthError, so that outboxd stops with one clear error instead of
// retrying for ever; brokers that are merely unreachable are logged and left
// to the service's restarts.
func checkKafka(ctx context.Context, sc *sarama.Config, brokers []string, sec *kafkaSecurity, log *zap.Logger) error {
	c := *sc
	c.Net.DialTimeout = 10 * time.Second
	c.Metadata.Retry.Max = 1
	c.Metadata.Full = false
	done := make(chan error, 1)
	go func() {
		client, err := sarama.NewClient(brokers, &c)
		if err != nil {
			done <- err
			return
		}
		err = client.RefreshMetadata() // connects (and authenticates)
		_ = client.Close()
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err == nil {
		return nil
	}
	var (
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalid     x509.CertificateInvalidError
		recordErr   tls.RecordHeaderError
		verifyErr   *tls.CertificateVerificationError
		opErr       *net.OpError
	)
	switch {
	case errors.Is(err, sarama.ErrSASLAuthenticationFailed), errors.Is(err, sarama.ErrUnsupportedSASLMechanism),
		errors.Is(err, sarama.ErrIllegalSASLState):
		return &KafkaAuthError{Msg: fmt.Sprintf("Kafka: SASL authentication as %q with %s failed (check --kafka-sasl-username, the password and --kafka-sasl-mechanism)",
			sec.SASLUser, sec.SASLMechanism), Err: err}
	case errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &verifyErr):
		return &KafkaAuthError{Msg: "Kafka: TLS verification of the broker failed (check --kafka-tls-ca-file and --kafka-tls-server-name)", Err: err}
	case errors.As(err, &opErr) && opErr.Op == "remote error" && sec.tlsEnabled():
		return &KafkaAuthError{Msg: "Kafka: the broker refused the TLS handshake (does it require a client certificate? check --kafka-tls-cert-file and --kafka-tls-key-file)", Err: err}
	case errors.As(err, &recordErr):
		return &KafkaAuthError{Msg: "Kafka: the broker does not speak TLS on that port (drop --kafka-tls, or use its TLS listener)", Err: err}
	}
	if errors.Is(err, io.EOF) && sec.SASLMechanism == "" && !sec.tlsEnabled() {
		log.Warn("Kafka closed the connection at once: if this listener needs TLS or SASL, set --kafka-tls or --kafka-sasl-mechanism; the publisher will keep retrying",
			zap.Strings("brokers", brokers), zap.Error(err))
		return nil
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, sarama.ErrOutOfBrokers) {
		log.Warn("Kafka is not reachable yet; the publisher will keep retrying", zap.Strings("brokers", brokers), zap.Error(err))
		return nil
	}
	log.Warn("Kafka connection check failed; the publisher will keep retrying", zap.Error(err))
	return nil
}

// checkKafkaConfig runs checkKafka with the producer's sarama settings.
func checkKafkaConfig(ctx context.Context, k publisher.KafkaConfig, sec *kafkaSecurity, log *zap.Logger) error {
	sc, err := k.Sarama()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	log.Info("connecting to Kafka", zap.Strings("brokers", k.Brokers), zap.String("security", sec.describe()))
	return checkKafka(ctx, sc, k.Brokers, sec, log)
}

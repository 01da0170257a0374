package kafka

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
)

// Security is how a client authenticates to Kafka and protects the
// connection: TLS (server verification against a CA, optional client
// certificate) and SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. outboxd, the
// poller and the consumer package share it, with the same flags.
type Security struct {
	TLS              bool
	CAFile           string
	CertFile         string
	KeyFile          string
	ServerName       string
	SASLMechanism    string
	SASLUser         string
	SASLPassword     string // secret
	SASLPasswordFile string
}

// AddFlags binds the --kafka-tls-* and --kafka-sasl-* flags to s.
func (s *Security) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&s.TLS, "kafka-tls", false, "connect to Kafka over TLS (implied by any other --kafka-tls-* flag)")
	fs.StringVar(&s.CAFile, "kafka-tls-ca-file", "", "PEM file of the CA certificates that verify the brokers (default: the system's)")
	fs.StringVar(&s.CertFile, "kafka-tls-cert-file", "", "PEM client certificate, for brokers that require one (with --kafka-tls-key-file)")
	fs.StringVar(&s.KeyFile, "kafka-tls-key-file", "", "PEM private key of --kafka-tls-cert-file")
	fs.StringVar(&s.ServerName, "kafka-tls-server-name", "", "name to verify the brokers' certificates against (default: the broker's host)")
	fs.StringVar(&s.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL")
	fs.StringVar(&s.SASLUser, "kafka-sasl-username", "", "SASL user name")
	fs.StringVar(&s.SASLPassword, "kafka-sasl-password", "", "SASL password (secret: prefer the environment or --kafka-sasl-password-file over the command line)")
	fs.StringVar(&s.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (one line)")
}

var saslMechanisms = []string{sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512}

// TLSEnabled reports whether any TLS setting is set.
func (s Security) TLSEnabled() bool {
	return s.TLS || s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.ServerName != ""
}

// Validate checks the settings and that the password file and the
// certificates can be read. It never quotes the password.
func (s Security) Validate() error {
	_, err := s.password()
	if err == nil && s.TLSEnabled() {
		_, err = s.tlsConfig()
	}
	return err
}

// password checks the settings and returns the SASL password (from the file
// when one is named).
func (s Security) password() (string, error) {
	var errs []error
	var pass string
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("Kafka TLS: --kafka-tls-cert-file and --kafka-tls-key-file go together"))
	}
	mech := s.mechanism()
	switch {
	case mech == "":
		if s.SASLUser != "" || s.SASLPassword != "" || s.SASLPasswordFile != "" {
			errs = append(errs, errors.New("Kafka SASL: a user or password is set but no --kafka-sasl-mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"))
		}
	case !slices.Contains(saslMechanisms, mech):
		errs = append(errs, fmt.Errorf("Kafka SASL: unknown mechanism %q: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.SASLMechanism))
	default:
		if s.SASLUser == "" {
			errs = append(errs, errors.New("Kafka SASL: --kafka-sasl-username is empty"))
		}
		switch {
		case s.SASLPassword != "" && s.SASLPasswordFile != "":
			errs = append(errs, errors.New("Kafka SASL: set --kafka-sasl-password or --kafka-sasl-password-file, not both"))
		case s.SASLPasswordFile != "":
			b, err := os.ReadFile(s.SASLPasswordFile)
			if err != nil {
				errs = append(errs, fmt.Errorf("Kafka SASL: read --kafka-sasl-password-file: %w", err))
			}
			pass = strings.TrimRight(string(b), "\r\n")
			if err == nil && pass == "" {
				errs = append(errs, fmt.Errorf("Kafka SASL: --kafka-sasl-password-file %s is empty", s.SASLPasswordFile))
			}
		case s.SASLPassword != "":
			pass = s.SASLPassword
		default:
			errs = append(errs, errors.New("Kafka SASL: no password: set OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file"))
		}
	}
	return pass, errors.Join(errs...)
}

func (s Security) mechanism() string { return strings.ToUpper(strings.TrimSpace(s.SASLMechanism)) }

// tlsConfig loads the certificates.
func (s Security) tlsConfig() (*tls.Config, error) {
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

// Apply sets TLS and SASL on a sarama configuration: it loads the
// certificates and the password.
func (s Security) Apply(c *sarama.Config) error {
	pass, err := s.password()
	if err != nil {
		return err
	}
	if s.TLSEnabled() {
		tc, err := s.tlsConfig()
		if err != nil {
			return err
		}
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = tc
	}
	mech, user := s.mechanism(), s.SASLUser
	if mech != "" {
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
	}
	return nil
}

// Describe is the security setup in a few words, for a startup log.
func (s Security) Describe() string {
	var parts []string
	if s.TLSEnabled() {
		parts = append(parts, "TLS")
	}
	if mech := s.mechanism(); mech != "" {
		parts = append(parts, fmt.Sprintf("SASL %s as %q", mech, s.SASLUser))
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

// AuthError is a Kafka connection that failed for a reason a retry cannot
// fix: authentication or TLS verification.
type AuthError struct {
	Msg string
	Err error
}

func (e *AuthError) Error() string { return e.Msg + ": " + e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// UnreachableError is Check finding no broker that answers: a wrong
// address, an unknown host, or Kafka not running.
type UnreachableError struct {
	Brokers []string
	Err     error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("Kafka: no broker of --kafka-brokers %s answered (check the addresses and that Kafka runs and listens there): %v",
		strings.Join(e.Brokers, ","), e.Err)
}
func (e *UnreachableError) Unwrap() error { return e.Err }

// Check connects to the brokers with cfg's settings, as a process starts.
// A failed authentication or TLS verification is returned as an
// *AuthError at once, and so is an unknown host; brokers that refuse or
// time out are tried again, about once a second and each attempt logged,
// until wait has passed (0: the first failure is final), and then returned
// as an *UnreachableError: a process stops with one clear error instead of
// retrying for ever (and before it creates anything); once started, the
// caller's sessions retry.
func Check(ctx context.Context, cfg Config, wait time.Duration, log *zap.Logger) error {
	sc, err := cfg.Sarama()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	log.Info("connecting to Kafka", zap.Strings("brokers", cfg.Brokers), zap.String("security", cfg.Security.Describe()))
	// An attempt has its own bound (the dial timeout below), so that a
	// --start-timeout of 0 still makes one whole attempt.
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		err := check(ctx, sc, cfg.Brokers, cfg.Security, log)
		if err == nil || ctx.Err() != nil {
			return err
		}
		var unreachable *UnreachableError
		var dnsErr *net.DNSError
		if !errors.As(err, &unreachable) || (errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		log.Warn("Kafka is not reachable yet; trying again within --start-timeout",
			zap.Int("attempt", attempt), zap.Duration("left", left.Round(time.Second)), zap.Strings("brokers", cfg.Brokers), zap.Error(err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(time.Second, left)):
		}
	}
}

func check(ctx context.Context, sc *sarama.Config, brokers []string, sec Security, log *zap.Logger) error {
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
		return &AuthError{Msg: fmt.Sprintf("Kafka: SASL authentication as %q with %s failed (check --kafka-sasl-username, the password and --kafka-sasl-mechanism)",
			sec.SASLUser, sec.mechanism()), Err: err}
	case errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &verifyErr):
		return &AuthError{Msg: "Kafka: TLS verification of the broker failed (check --kafka-tls-ca-file and --kafka-tls-server-name)", Err: err}
	case errors.As(err, &opErr) && opErr.Op == "remote error" && sec.TLSEnabled():
		return &AuthError{Msg: "Kafka: the broker refused the TLS handshake (does it require a client certificate? check --kafka-tls-cert-file and --kafka-tls-key-file)", Err: err}
	case errors.As(err, &recordErr):
		return &AuthError{Msg: "Kafka: the broker does not speak TLS on that port (drop --kafka-tls, or use its TLS listener)", Err: err}
	}
	if errors.Is(err, io.EOF) && sec.mechanism() == "" && !sec.TLSEnabled() {
		log.Warn("Kafka closed the connection at once: if this listener needs TLS or SASL, set --kafka-tls or --kafka-sasl-mechanism; the publisher will keep retrying",
			zap.Strings("brokers", brokers), zap.Error(err))
		return nil
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, sarama.ErrOutOfBrokers) {
		return &UnreachableError{Brokers: brokers, Err: err}
	}
	log.Warn("Kafka connection check failed; the publisher will keep retrying", zap.Error(err))
	return nil
}

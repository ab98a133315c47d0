package kafkax

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// TLS is the client side of TLS to the brokers, set by kafka.tls.*.
type TLS struct {
	Enabled            bool   `key:"enabled" help:"TLS to the brokers (every client: consumer, relay producer, admin, readback, probe)"`
	CAFile             string `key:"ca_file" help:"PEM CA certificates the brokers' must chain to (empty: the system's)"`
	CertFile           string `key:"cert_file" help:"PEM client certificate, for brokers that ask for one (with kafka.tls.key_file)"`
	KeyFile            string `key:"key_file" help:"PEM private key of kafka.tls.cert_file"`
	ServerName         string `key:"server_name" help:"name the brokers' certificates must carry (empty: each broker's host)"`
	InsecureSkipVerify bool   `key:"insecure_skip_verify" help:"accept any broker certificate (a throw-away test broker only)"`
}

// SASL mechanisms a Config accepts in kafka.sasl.mechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL is the authentication to the brokers, set by kafka.sasl.*. An empty Mechanism means
// none.
type SASL struct {
	Mechanism    string `key:"mechanism" help:"SASL authentication: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: none)"`
	User         string `key:"user" help:"SASL user"`
	Password     string `key:"password" help:"SASL password; better from ONCEFLOW_KAFKA_SASL_PASSWORD or kafka.sasl.password_file"`
	PasswordFile string `key:"password_file" help:"file whose first line is the SASL password (read again at each client start)"`
}

// base applies a Config's TLS and SASL. So every client built from a Config uses them. These
// clients are the consumers, the producers including the relay's transactional one, the
// admin client, ReadAll and Probe.

// CheckSecurity validates kafka.tls.* and kafka.sasl.* and reads the files they name. So a
// missing or unreadable file is a configuration error before anything connects. Validate
// calls it too.
func (c Config) CheckSecurity() error {
	if _, err := c.TLS.config(); err != nil {
		return err
	}
	_, err := c.SASL.password()
	return err
}

// config builds the tls.Config, or nil when TLS is off.
func (t TLS) config() (*tls.Config, error) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify {
			return nil, errors.New("kafka.tls.* is set but kafka.tls.enabled is false")
		}
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // InsecureSkipVerify only when configured
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("kafka.tls.cert_file and kafka.tls.key_file: set both or neither")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// password returns the SASL password, which is Password or the first line of PasswordFile.
// It also checks the mechanism and the user.
func (s SASL) password() (string, error) {
	switch s.Mechanism {
	case "":
		if s.User != "" || s.Password != "" || s.PasswordFile != "" {
			return "", errors.New("kafka.sasl.* is set but kafka.sasl.mechanism is empty (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return "", nil
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		return "", fmt.Errorf("kafka.sasl.mechanism %q: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
	if s.User == "" {
		return "", fmt.Errorf("kafka.sasl.user is empty (mechanism %s)", s.Mechanism)
	}
	if s.Password != "" && s.PasswordFile != "" {
		return "", errors.New("kafka.sasl.password and kafka.sasl.password_file: set one, not both")
	}
	if s.PasswordFile == "" {
		if s.Password == "" {
			return "", errors.New("kafka.sasl.password_file (or kafka.sasl.password, env ONCEFLOW_KAFKA_SASL_PASSWORD) is empty")
		}
		return s.Password, nil
	}
	b, err := os.ReadFile(s.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("kafka.sasl.password_file: %w", err)
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimRight(pw, "\r")
	if pw == "" {
		return "", fmt.Errorf("kafka.sasl.password_file %s: the first line is empty", s.PasswordFile)
	}
	return pw, nil
}

// applySecurity sets TLS and SASL on sc. The files are read again each time, so a client
// started after a certificate or password was rotated uses the new one.
func (c Config) applySecurity(sc *sarama.Config) error {
	tc, err := c.TLS.config()
	if err != nil {
		return err
	}
	if tc != nil {
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	pw, err := c.SASL.password()
	if err != nil {
		return err
	}
	if c.SASL.Mechanism == "" {
		return nil
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	sc.Net.SASL.User = c.SASL.User
	sc.Net.SASL.Password = pw
	switch c.SASL.Mechanism {
	case SASLPlain:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case SASLScramSHA256:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha256.New)} }
	case SASLScramSHA512:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha512.New)} }
	}
	return nil
}

// scramClient is Sarama's SCRAMClient on github.com/xdg-go/scram. Sarama speaks the SASL
// exchange but leaves the SCRAM computation of RFC 5802 and RFC 7677 to the caller.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (x *scramClient) Begin(user, password, authzID string) error {
	c, err := x.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	x.conv = c.NewConversation()
	return nil
}

func (x *scramClient) Step(challenge string) (string, error) { return x.conv.Step(challenge) }
func (x *scramClient) Done() bool                            { return x.conv.Done() }

// failDialer makes every connection of a client fail with err. base cannot return an
// error. So settings that cannot be applied, such as a file gone since Validate, fail the
// client's start with that error instead of connecting without them.
type failDialer struct{ err error }

func (d failDialer) Dial(string, string) (net.Conn, error) { return nil, d.err }

// causeOf names why a connection to the brokers failed when the network was not the cause.
// The cause is TLS verification, SASL authentication, or a mismatch of TLS and plaintext.
// causeOf returns "" otherwise.
func causeOf(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		recordHdr tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknownCA):
		return "TLS: the broker's certificate is signed by an authority not trusted here (kafka.tls.ca_file)"
	case errors.As(err, &hostname):
		return "TLS: the broker's certificate is not valid for " + hostname.Host + " (kafka.tls.server_name)"
	case errors.As(err, &invalid):
		return "TLS: the broker's certificate is invalid: " + invalid.Error()
	case errors.As(err, &verify):
		return "TLS: the broker's certificate was refused: " + verify.Err.Error()
	case errors.As(err, &recordHdr):
		return "TLS: the broker does not speak TLS on this port (kafka.tls.enabled)"
	case errors.Is(err, sarama.ErrSASLAuthenticationFailed): // a sentinel of Sarama's: Is, not As
		return "SASL authentication failed: wrong user or password (kafka.sasl.user, kafka.sasl.password_file)"
	case errors.Is(err, sarama.ErrUnsupportedSASLMechanism):
		return "SASL: the broker does not enable this mechanism (kafka.sasl.mechanism)"
	case errors.Is(err, sarama.ErrIllegalSASLState):
		return "SASL: the broker refused the exchange (kafka.sasl.mechanism)"
	}
	if s := err.Error(); strings.Contains(s, "tls: ") || strings.Contains(s, "x509: ") {
		return "TLS: " + oneLine(s)
	}
	return ""
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

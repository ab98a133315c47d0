package kafkax_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Bad kafka.tls.* / kafka.sasl.* settings are refused by Validate, naming the key, before
// anything connects.
func TestSecurityValidate(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  kafkax.TLS
		sasl kafkax.SASL
		want string // "" = valid
	}{
		{"none", kafkax.TLS{}, kafkax.SASL{}, ""},
		{"tls, system roots", kafkax.TLS{Enabled: true}, kafkax.SASL{}, ""},
		{"scram-512 from file", kafkax.TLS{Enabled: true}, kafkax.SASL{Mechanism: "SCRAM-SHA-512", User: "u", PasswordFile: pwFile}, ""},
		{"plain inline", kafkax.TLS{}, kafkax.SASL{Mechanism: "PLAIN", User: "u", Password: "p"}, ""},
		{"tls file without enabled", kafkax.TLS{CAFile: notPEM}, kafkax.SASL{}, "kafka.tls.enabled"},
		{"missing ca", kafkax.TLS{Enabled: true, CAFile: filepath.Join(dir, "nope.pem")}, kafkax.SASL{}, "kafka.tls.ca_file"},
		{"ca not pem", kafkax.TLS{Enabled: true, CAFile: notPEM}, kafkax.SASL{}, "no PEM certificate"},
		{"cert without key", kafkax.TLS{Enabled: true, CertFile: notPEM}, kafkax.SASL{}, "kafka.tls.cert_file and kafka.tls.key_file"},
		{"unknown mechanism", kafkax.TLS{}, kafkax.SASL{Mechanism: "GSSAPI", User: "u", Password: "p"}, "kafka.sasl.mechanism"},
		{"no user", kafkax.TLS{}, kafkax.SASL{Mechanism: "SCRAM-SHA-256", Password: "p"}, "kafka.sasl.user"},
		{"no password", kafkax.TLS{}, kafkax.SASL{Mechanism: "SCRAM-SHA-256", User: "u"}, "kafka.sasl.password_file"},
		{"both passwords", kafkax.TLS{}, kafkax.SASL{Mechanism: "PLAIN", User: "u", Password: "p", PasswordFile: pwFile}, "set one"},
		{"missing password file", kafkax.TLS{}, kafkax.SASL{Mechanism: "PLAIN", User: "u", PasswordFile: filepath.Join(dir, "nope")}, "kafka.sasl.password_file"},
		{"empty password file", kafkax.TLS{}, kafkax.SASL{Mechanism: "PLAIN", User: "u", PasswordFile: emptyFile}, "first line is empty"},
		{"user without mechanism", kafkax.TLS{}, kafkax.SASL{User: "u"}, "kafka.sasl.mechanism is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := kafkax.Config{TLS: tc.tls, SASL: tc.sasl}
			c = c.WithDefaults()
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				sc := c.SaramaConfig()
				if sc.Net.TLS.Enable != tc.tls.Enabled || sc.Net.SASL.Enable != (tc.sasl.Mechanism != "") {
					t.Fatalf("sarama config: tls %v sasl %v", sc.Net.TLS.Enable, sc.Net.SASL.Enable)
				}
				if tc.sasl.PasswordFile != "" && sc.Net.SASL.Password != "s3cret" {
					t.Fatalf("password from file: %q, want its first line", sc.Net.SASL.Password)
				}
				if err := sc.Validate(); err != nil {
					t.Fatalf("sarama refuses the config: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// A setting that can no longer be applied when a client starts (its file removed after
// Validate) fails that client's start with the reason instead of connecting without it.
func TestSecurityFileGoneFailsTheClient(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("p\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := kafkax.Config{Brokers: []string{"127.0.0.1:1"}, SASL: kafkax.SASL{Mechanism: "PLAIN", User: "u", PasswordFile: pwFile}}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	os.Remove(pwFile)
	_, err := c.CheckTopics("t")
	if err == nil || !strings.Contains(err.Error(), "kafka.sasl.password_file") {
		t.Fatalf("CheckTopics: %v, want the password file's error", err)
	}
}

// Every client kind of the package (metadata, admin, producer, readback, probe) works over
// the SASL_SSL listener of scripts/infra.sh alone, with each mechanism the broker enables.
func TestSASLSSLClients(t *testing.T) {
	c := testenv.SecureKafka(t)
	for _, mech := range []string{kafkax.SASLScramSHA512, kafkax.SASLScramSHA256, kafkax.SASLPlain} {
		m := c
		m.SASL.Mechanism = mech
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := m.Probe(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: probe: %v", mech, err)
		}
	}
	// A client certificate of the local CA is accepted by the listener, which asks for one.
	withCert := c
	withCert.TLS.CertFile, withCert.TLS.KeyFile = testenv.TLSFile("client.pem"), testenv.TLSFile("client.key")
	if err := withCert.Probe(context.Background()); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}

	topic := testenv.Topic(t, c, "sasl-ssl", 2)
	if _, err := c.TopicRetention(topic); err != nil {
		t.Fatalf("admin over SASL_SSL: %v", err)
	}
	p, err := c.NewSyncProducer()
	if err != nil {
		t.Fatalf("producer over SASL_SSL: %v", err)
	}
	defer p.Close()
	if err := p.SendMessages([]*sarama.ProducerMessage{
		{Topic: topic, Key: sarama.StringEncoder("a"), Value: sarama.StringEncoder("1")},
		{Topic: topic, Key: sarama.StringEncoder("b"), Value: sarama.StringEncoder("2")},
	}); err != nil {
		t.Fatalf("produce over SASL_SSL: %v", err)
	}
	recs, err := c.ReadAll(context.Background(), topic, time.Second)
	if err != nil || len(recs) != 2 {
		t.Fatalf("read back over SASL_SSL: %d records, %v", len(recs), err)
	}
}

// A wrong password and an untrusted CA each fail the client's start with one line that names
// the broker and the cause.
func TestSASLSSLRefusals(t *testing.T) {
	good := testenv.SecureKafka(t)
	broker := good.Brokers[0]

	wrongPW := good
	wrongPW.SASL.PasswordFile, wrongPW.SASL.Password = "", "not-the-password"
	otherCA := good
	otherCA.TLS.CAFile = testenv.OtherCA(t)
	wrongName := good
	wrongName.TLS.ServerName = "not-this-host.example"

	for _, tc := range []struct {
		name string
		c    kafkax.Config
		want string
	}{
		{"wrong password", wrongPW, "SASL authentication failed"},
		{"untrusted CA", otherCA, "authority not trusted"},
		{"wrong server name", wrongName, "not valid for not-this-host.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.CheckTopics()
			if err == nil {
				t.Fatal("CheckTopics succeeded")
			}
			msg := err.Error()
			var se *kafkax.SecurityError
			if !errors.As(err, &se) || !strings.Contains(msg, tc.want) || !strings.Contains(msg, tc.c.Brokers[0]) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q, want one line naming %s and %q", msg, tc.c.Brokers[0], tc.want)
			}
			if strings.Contains(msg, "not-the-password") {
				t.Fatalf("error shows the password: %q", msg)
			}
			t.Logf("%s: %s", broker, msg)
		})
	}
}

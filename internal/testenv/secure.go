package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// `scripts/infra.sh up` makes TLS material and secured endpoints. They are a local CA, a
// server certificate for the broker and MariaDB, a client certificate, and the Kafka SASL
// user's password. They are also a SASL_SSL listener and a MariaDB user that must use TLS.

// TLSDir is where scripts/infra.sh writes the CA, the certificates and the Kafka user's
// password. It is $OFTEST_TLS_DIR, else <repository>/.run/tls.
func TLSDir() string {
	if d := os.Getenv("OFTEST_TLS_DIR"); d != "" {
		return d
	}
	root, err := repoRoot()
	if err != nil {
		return filepath.Join(".run", "tls")
	}
	return filepath.Join(root, ".run", "tls")
}

// TLSFile is the path of a file of TLSDir, such as ca.pem, server.pem, client.pem,
// client.key or kafka-onceflow.password.
func TLSFile(name string) string { return filepath.Join(TLSDir(), name) }

// SecureBrokers is the SASL_SSL bootstrap list from OFTEST_SASL_BROKERS, 127.0.0.1:9094 by
// default.
func SecureBrokers() []string {
	return strings.Split(env("OFTEST_SASL_BROKERS", "127.0.0.1:9094"), ",")
}

// SecureKafkaUser is the SASL user of SecureBrokers from OFTEST_SASL_USER, onceflow by
// default. Its password is the first line of TLSFile("kafka-<user>.password").
func SecureKafkaUser() string { return env("OFTEST_SASL_USER", "onceflow") }

// SecureKafka returns a client config for the SASL_SSL listener only. It verifies TLS
// against the local CA and authenticates with SCRAM-SHA-512 as SecureKafkaUser. The test
// fails, saying how to start the listener, when the files are missing or the listener does
// not answer.
func SecureKafka(t testing.TB) kafkax.Config {
	t.Helper()
	Integration(t)
	user := SecureKafkaUser()
	c := kafkax.Config{Brokers: SecureBrokers(), ClientID: "onceflow-test", SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 10 * time.Second, HeartbeatEvery: time.Second, MaxPollWait: 50 * time.Millisecond,
		TLS:  kafkax.TLS{Enabled: true, CAFile: TLSFile("ca.pem")},
		SASL: kafkax.SASL{Mechanism: kafkax.SASLScramSHA512, User: user, PasswordFile: TLSFile("kafka-" + user + ".password")}}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("testenv: SASL_SSL client settings: %v\n%s (it writes %s)", err, howToStart, TLSDir())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Probe(ctx); err != nil {
		t.Fatalf("testenv: Kafka SASL_SSL listener at %s: %v\n%s", strings.Join(c.Brokers, ","), err, howToStart)
	}
	return c
}

// TLSAppUser is user:password of the MariaDB user that must connect with TLS, by REQUIRE
// SSL. It has the application user's grants. OFTEST_TLS_APP_USER sets it, and it is
// onceflow_tls:onceflow_tls by default.
func TLSAppUser() string { return env("OFTEST_TLS_APP_USER", "onceflow_tls:onceflow_tls") }

// OtherCA writes a PEM CA certificate of its own, which signed nothing the local services
// have, and returns its path. A client that trusts only it must refuse them.
func OtherCA(t testing.TB) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "some other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

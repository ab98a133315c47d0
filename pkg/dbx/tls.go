package dbx

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"
)

// TLS is the client side of TLS to the database server, set by db.tls.*. Setting any field
// turns TLS on, always verified. The server's certificate must chain to CAFile, or to the
// system's roots when CAFile is empty. It must carry ServerName, or the DSN's host when
// ServerName is empty.
type TLS struct {
	CAFile     string `key:"ca_file" help:"TLS to the database (any db.tls.* key turns it on, always verified): PEM CA certificates the server's must chain to (empty: the system's)"`
	CertFile   string `key:"cert_file" help:"PEM client certificate, for servers that ask for one (with db.tls.key_file)"`
	KeyFile    string `key:"key_file" help:"PEM private key of db.tls.cert_file"`
	ServerName string `key:"server_name" help:"name the server's certificate must carry (empty: the DSN's host)"`
}

// Enabled reports whether any field is set.
func (t TLS) Enabled() bool { return t != TLS{} }

// Config reads the files and builds the tls.Config.
func (t TLS) Config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("db.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("db.tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("db.tls.cert_file and db.tls.key_file: set both or neither")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("db.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

var registered sync.Map // name -> struct{}: names RegisterTLS registered with the driver

// RegisterTLS reads t's files and registers the result with the driver's
// mysql.RegisterTLSConfig. The name it registers and returns derives from t and the files'
// contents. A DSN of one's own uses it as tls=<name>. The same settings and files give the
// same name. Changed files give a new one, so a pool opened after a certificate was rotated
// uses the new certificate.
func RegisterTLS(t TLS) (string, error) {
	tc, err := t.Config()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q %q\n", t.CAFile, t.CertFile, t.KeyFile, t.ServerName)
	for _, f := range []string{t.CAFile, t.CertFile, t.KeyFile} {
		if f != "" {
			b, _ := os.ReadFile(f) // read by Config just now
			h.Write(b)
		}
	}
	name := "onceflow-" + hex.EncodeToString(h.Sum(nil))[:16]
	if _, ok := registered.Load(name); ok {
		return name, nil
	}
	if err := mysql.RegisterTLSConfig(name, tc); err != nil {
		return "", fmt.Errorf("db.tls: %w", err)
	}
	registered.Store(name, struct{}{})
	return name, nil
}

// ReadSecretFile returns the first line of a file holding a password or token. key names
// the setting in errors. An empty first line is an error.
func ReadSecretFile(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("%s %s: the first line is empty", key, path)
	}
	return line, nil
}

package dbx

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// A go-sql-driver DSN is read the way the driver's own ParseDSN reads it.
//
//	user:password@tcp(address)/database?param=value&param=value
//
// The database name starts after the last '/'. The credentials end at the last '@' before
// that slash. The address is inside the parentheses between that '@' and the slash. Nothing
// in the database name or the parameters is ever read as an address.

// addrSpan is where the address of a go-sql-driver DSN lies, dsn[start:end], and the
// network named before it. ok is false for a DSN without parentheses before its database
// name, which gets the driver's default address, and for one the driver refuses.
func addrSpan(dsn string) (network string, start, end int, ok bool) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash <= 0 || dsn[slash-1] != ')' {
		return "", 0, 0, false
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	open := strings.IndexByte(dsn[at+1:slash], '(')
	if open < 0 {
		return "", 0, 0, false
	}
	return dsn[at+1 : at+1+open], at + 1 + open + 1, slash - 1, true
}

// dsnQuery is the raw parameter string of a go-sql-driver DSN, after the first '?' that
// follows its database name's slash, and where it starts. It starts at -1 when the DSN has
// none.
func dsnQuery(dsn string) (int, string) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return -1, ""
	}
	q := strings.IndexByte(dsn[slash+1:], '?')
	if q < 0 {
		return -1, ""
	}
	start := slash + 1 + q + 1
	return start, dsn[start:]
}

// hasParam reports a parameter key set in a go-sql-driver DSN, whatever its value.
func hasParam(dsn, key string) bool {
	_, q := dsnQuery(dsn)
	for pair := range strings.SplitSeq(q, "&") {
		if k, _, _ := strings.Cut(pair, "="); k == key {
			return true
		}
	}
	return false
}

// withParam adds a parameter to a go-sql-driver DSN.
func withParam(dsn, key, value string) string {
	sep := "?"
	if i, _ := dsnQuery(dsn); i >= 0 {
		sep = "&"
	}
	return dsn + sep + key + "=" + value
}

// ParseDriverDSN is go-sql-driver's ParseDSN for a DSN whose tcp(...) part may list several
// servers, comma separated. The config's Addr is then the list, which NewConnector takes.
//
// ParseDriverDSN refuses a DSN that the driver would read differently from what it seems to
// say. Such a DSN has a server list with an empty or malformed entry, or a database name or
// parameter that holds an address such as "@tcp(…)". A PostgreSQL keyword/value string is
// refused too. ParseDriverDSN adds none of ParseDSN's settings. Its errors show the DSN
// masked.
func ParseDriverDSN(dsn string) (*mysql.Config, error) {
	if dsn == "" {
		return nil, errors.New("database dsn is empty: set db.dsn (env ONCEFLOW_DB_DSN), e.g. onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow")
	}
	if IsPostgresDSN(dsn) {
		return nil, fmt.Errorf("database dsn %q is PostgreSQL's, not MySQL's", MaskDSN(dsn))
	}
	// The driver reads one address. So it parses the DSN with the list's first server, and
	// the list is put back for NewConnector.
	parse, servers := dsn, []string(nil)
	if network, start, end, ok := addrSpan(dsn); ok && (network == "tcp" || network == "") && strings.Contains(dsn[start:end], ",") {
		list, err := checkServers(dsn[start:end])
		if err != nil {
			return nil, fmt.Errorf("bad database dsn %q: %w", MaskDSN(dsn), err)
		}
		servers = list
		parse = dsn[:start] + list[0] + dsn[end:]
	}
	mc, err := mysql.ParseDSN(parse)
	if err != nil || strings.Contains(mc.User, "=") {
		if keywordDSN.MatchString(dsn) || err == nil {
			return nil, fmt.Errorf("bad database dsn %q: a PostgreSQL keyword/value string: write it as a URL, postgres://user@host:port/db", MaskDSN(dsn))
		}
		return nil, fmt.Errorf("bad database dsn %q: %s (expected user:pass@tcp(host:port)/db)", MaskDSN(dsn), driverDetail(err, dsn))
	}
	if servers != nil {
		mc.Addr = strings.Join(servers, ",")
	}
	if err := checkNoAddress(dsn, mc); err != nil {
		return nil, fmt.Errorf("bad database dsn %q: %w: the servers go in the address part, user:pass@tcp(host:port,host:port)/db", MaskDSN(dsn), err)
	}
	return mc, nil
}

// checkServers reads the server list of a tcp(a,b,c) address. Each entry is a host with an
// optional port, and none is empty.
func checkServers(list string) ([]string, error) {
	var out []string
	// The list as an error shows it: on one line, a control character escaped.
	shown := strings.Trim(strconv.Quote(list), `"`)
	for i, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("server %d of tcp(%s) is empty", i+1, shown)
		}
		hp := a
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(a, "3306") // the driver's default port
		}
		host, port, err := net.SplitHostPort(hp)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || strings.ContainsAny(host, "@()/?,\\ \t\r\n") || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("server %q of tcp(%s) is not host:port", a, shown)
		}
		out = append(out, a)
	}
	return out, nil
}

// addressLike matches what a reader scanning for the protocol part, such as "@tcp(" or
// "@unix(", would take for one.
var addressLike = regexp.MustCompile(`@[A-Za-z0-9_]*\(`)

// checkNoAddress refuses a database name or parameter that holds something shaped like an
// address. The driver never reads it as one, but a person or a tool may.
func checkNoAddress(dsn string, mc *mysql.Config) error {
	if addressLike.MatchString(mc.DBName) {
		return errors.New("the database name holds an address")
	}
	_, q := dsnQuery(dsn)
	for pair := range strings.SplitSeq(q, "&") {
		k, v, _ := strings.Cut(pair, "=")
		uv, err := url.QueryUnescape(v)
		if err != nil {
			uv = v
		}
		if addressLike.MatchString(k) {
			return errors.New("a parameter name holds an address")
		}
		if addressLike.MatchString(v) || addressLike.MatchString(uv) {
			return fmt.Errorf("parameter %s holds an address", k)
		}
	}
	return nil
}

// driverDetail is go-sql-driver's parse error for dsn, on one line, with anything of dsn that
// may be a password replaced by ***.
func driverDetail(err error, dsn string) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "default addr for network '") {
		// The driver quotes the text before the slash, credentials included.
		msg = "no tcp(host:port) or unix(/path) address before the database name"
	}
	return scrub(strings.Join(strings.Fields(msg), " "), dsn)
}

// pgDetail is pgx's parse error for dsn, on one line, without pgx's quote of the DSN, with
// anything of dsn that may be a password replaced by ***.
func pgDetail(err error, dsn string) string {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
			if i := strings.Index(rest, "`: "); i >= 0 {
				msg = rest[i+len("`: "):]
			}
		}
	}
	return scrub(strings.Join(strings.Fields(msg), " "), dsn)
}

// scrub replaces in msg every text of dsn that may be its password (dsnSecrets) by ***.
func scrub(msg, dsn string) string {
	for _, s := range dsnSecrets(dsn) {
		msg = strings.ReplaceAll(msg, s, "***")
	}
	return msg
}

// dsnSecrets are the texts of a DSN of any form that may be a password, as written and
// decoded, longest first. They are what follows the credentials' ':' up to each '@', and
// the values of password parameters. Such parameters may be in a URL query, in
// go-sql-driver parameters or in keyword/value pairs. In a DSN without '@', what follows a
// ':' up to the address or the slash is a secret too.
func dsnSecrets(dsn string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if u, err := url.PathUnescape(s); err == nil && u != s {
			out = append(out, u)
		}
		if u := strings.ReplaceAll(s, `\`, ""); u != s && u != "" {
			out = append(out, u)
		}
	}
	head, isURL := dsn, false
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if rest, ok := strings.CutPrefix(dsn, scheme); ok {
			head, isURL = rest, true
		}
	}
	if c := strings.IndexByte(head, ':'); c >= 0 {
		found := false
		for i := c + 1; i < len(head); i++ {
			if head[i] == '@' {
				add(head[c+1 : i])
				found = true
			}
		}
		if !found && !isURL {
			rest := head[c+1:]
			if i := strings.IndexAny(rest, "/("); i >= 0 {
				rest = rest[:i]
			}
			add(rest)
		}
	}
	if _, q := dsnQuery(dsn); q != "" {
		for _, p := range queryParams(q) {
			if p.secret {
				add(q[p.start:p.end])
			}
		}
	}
	if i := strings.IndexByte(head, '?'); i >= 0 {
		q := head[i+1:]
		for _, p := range queryParams(q) {
			if p.secret {
				add(q[p.start:p.end])
			}
		}
	}
	if strings.Contains(dsn, "=") {
		for _, kv := range keywordPairs(dsn) {
			if kv.secret {
				v := dsn[kv.start:kv.end]
				add(v)
				add(strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'"))
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out)
}

// secretKey reports a parameter whose value is a secret. Any key naming a password is one.
func secretKey(k string) bool {
	if u, err := url.QueryUnescape(k); err == nil {
		k = u
	}
	k = strings.ToLower(strings.TrimSpace(k))
	return strings.Contains(k, "pass") || strings.Contains(k, "pwd") || strings.Contains(k, "secret")
}

// param is one key=value pair of a query string. The value is q[start:end].
type param struct {
	start, end int
	secret     bool
}

// queryParams splits a query string such as k=v&k=v into its pairs.
func queryParams(q string) []param {
	var out []param
	off := 0
	for pair := range strings.SplitSeq(q, "&") {
		if k, _, ok := strings.Cut(pair, "="); ok {
			out = append(out, param{start: off + len(k) + 1, end: off + len(pair), secret: secretKey(k)})
		}
		off += len(pair) + 1
	}
	return out
}

// maskQuery replaces the values of q's password parameters by ***.
func maskQuery(q string) string {
	var b strings.Builder
	last := 0
	for _, p := range queryParams(q) {
		if p.secret {
			b.WriteString(q[last:p.start])
			b.WriteString("***")
			last = p.end
		}
	}
	b.WriteString(q[last:])
	return b.String()
}

// keywordDSN matches a DSN that starts as libpq's keyword/value form does, such as
// "host=… user=…". Such a DSN starts with a key without ':', '@', '/' or '('. A
// go-sql-driver DSN has one of these before its first '='.
var keywordDSN = regexp.MustCompile(`^\s*[^\s=:@/(]+\s*=`)

// keywordPairs reads a keyword/value string leniently, as pgx does. A value is a quoted
// string with backslash escapes, or runs to the next space. The value of a pair is
// s[start:end]. A malformed pair is a key with a space in it, or text with no '=' at the
// end. It is secret from its second word on, and start is there.
func keywordPairs(s string) []param {
	space := func(c byte) bool { return isSpace(rune(c)) }
	var out []param
	i := 0
	for {
		for i < len(s) && space(s[i]) {
			i++
		}
		if i >= len(s) {
			return out
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			// Text without '=' at the end is malformed. Its first word shows, and the rest not.
			if w := strings.IndexFunc(s[i:], isSpace); w >= 0 {
				out = append(out, param{start: i + w, end: len(s), secret: true})
			}
			return out
		}
		key := strings.TrimSpace(s[i : i+eq])
		keyStart := i
		i += eq + 1
		for i < len(s) && space(s[i]) {
			i++
		}
		start := i
		if i < len(s) && s[i] == '\'' {
			for i++; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			i++ // the closing quote
		} else {
			for ; i < len(s) && !space(s[i]); i++ {
				if s[i] == '\\' {
					i++
				}
			}
		}
		i = min(i, len(s))
		p := param{start: start, end: i, secret: secretKey(key)}
		if w := strings.IndexFunc(key, isSpace); w >= 0 {
			p.start, p.secret = keyStart+w, true
		}
		out = append(out, p)
	}
}

// isSpace is libpq's white space in a keyword/value string.
func isSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'
}

// maskKeywords replaces the secret values of a keyword/value string by ***.
func maskKeywords(s string) string {
	var b strings.Builder
	last := 0
	for _, p := range keywordPairs(s) {
		if p.secret && p.start >= last {
			b.WriteString(s[last:p.start])
			b.WriteString("***")
			last = p.end
		}
	}
	b.WriteString(s[last:])
	return b.String()
}

// MaskDSN hides the password of a DSN of any form for logs and errors.
//
// A go-sql-driver DSN that the driver parses is shown as written, with *** for the password
// the driver reads. This holds whatever the password contains, such as '@', ':', '/' or
// '('. An empty password stays empty.
//
// A DSN that the driver does not parse is shown from its protocol part on. That part starts
// at "@tcp(" or "@unix(", or else at the last '@'. Everything before it, the user included,
// shows as ***. A DSN without '@' is shown as is, unless it has a ':'. That ':' could be
// part of a "user:password" that lacks its '@'.
//
// A postgres:// URL shows *** for the password of its credentials. A keyword/value string
// such as "host=… password=…" shows *** for the values of its password keys. In every form,
// the values of parameters named for a password, such as password= and sslpassword=, are
// ***.
func MaskDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	if IsPostgresDSN(dsn) {
		return maskPostgres(dsn)
	}
	// A user holding '=' is a keyword/value string that go-sql-driver happens to parse.
	mc, err := mysql.ParseDSN(dsn)
	if err != nil || strings.Contains(mc.User, "=") {
		return maskUnparsed(dsn)
	}
	out := dsn
	// The driver reads "user:password@" up to the last '@' before the database's slash.
	// Keep the rest verbatim. A reformatted DSN would drop parameters set to their defaults,
	// such as interpolateParams=false, which ParseDSN in this package reads from the text.
	if mc.Passwd != "" {
		if cred := mc.User + ":" + mc.Passwd + "@"; strings.HasPrefix(dsn, cred) {
			out = mc.User + ":***" + dsn[len(cred)-1:]
		} else {
			mc.Passwd = "***"
			out = mc.FormatDSN()
		}
	}
	if i, q := dsnQuery(out); i >= 0 {
		out = out[:i] + maskQuery(q)
	}
	return out
}

// maskUnparsed masks a DSN that go-sql-driver cannot parse. It masks the values of its
// password keys, in keyword/value pairs or in parameters. It also masks everything before
// its protocol part. A DSN without '@' that has a ':' shows nothing before a tcp( or unix(
// part, unless it is a keyword/value string.
func maskUnparsed(dsn string) string {
	if strings.Contains(dsn, "=") {
		dsn = maskKeywords(dsn)
	}
	if i := strings.IndexByte(dsn, '?'); i >= 0 {
		dsn = dsn[:i+1] + maskQuery(dsn[i+1:])
	}
	cut := max(strings.LastIndex(dsn, "@tcp("), strings.LastIndex(dsn, "@unix("))
	if cut < 0 {
		cut = strings.LastIndex(dsn, "@")
	}
	switch {
	case cut >= 0:
		return "***" + dsn[cut:]
	case !strings.Contains(dsn, ":") || keywordDSN.MatchString(dsn):
		return dsn
	}
	if cut = max(strings.LastIndex(dsn, "tcp("), strings.LastIndex(dsn, "unix(")); cut > 0 {
		return "***" + dsn[cut:]
	}
	return "***"
}

// maskPostgres masks the password of a postgres:// URL's credentials and the values of its
// password parameters. pgx ends the credentials at the first '@' before any '/'. The mask
// ends them at the last one, so a password holding an unencoded '@' shows no part of it.
// An '@' that comes only after a '/', with a ':' before it, could end a password holding an
// unencoded '/'. So everything up to that '@' is ***.
func maskPostgres(dsn string) string {
	scheme := "postgres://"
	if strings.HasPrefix(dsn, "postgresql://") {
		scheme = "postgresql://"
	}
	p := dsn[len(scheme):]
	var b strings.Builder
	b.WriteString(scheme)
	auth := p
	if i := strings.IndexByte(p, '/'); i >= 0 {
		auth = p[:i]
	}
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		user, pw, has := strings.Cut(auth[:at], ":")
		b.WriteString(user)
		if has {
			b.WriteString(":")
			if pw != "" {
				b.WriteString("***")
			}
		}
		p = p[at:]
	} else if at := strings.LastIndexByte(p, '@'); at >= 0 && strings.Contains(p[:at], ":") {
		b.WriteString("***")
		p = p[at:]
	}
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i+1] + maskQuery(p[i+1:])
	}
	b.WriteString(p)
	return b.String()
}

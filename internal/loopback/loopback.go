// Package loopback holds the access rule of a router listener without a token, such as
// admin.listen or http.listen. Such a listener is bound to a loopback address. It answers
// only requests addressed to a loopback name. So an attacker who re-points a web page's DNS
// name to 127.0.0.1, by DNS rebinding, reaches nothing through the victim's browser.
package loopback

import (
	"net"
	"net/http"
	"strings"
)

// Name reports whether host names this machine. Such a host is "localhost" or a loopback
// IP, with or without a port. An IPv6 address may come with or without brackets. A Host
// header of any other name, an empty one included, is not this machine's.
func Name(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Refused is the answer to a request for another name. It is 421 Misdirected Request,
// because the request was meant for another server.
const Refused = http.StatusMisdirectedRequest

// Message is the fixed text of a refusal. It does not echo the Host sent.
const Message = "misdirected request: this listener has no token and answers only requests for 127.0.0.1, [::1] or localhost"

// Only serves h to requests whose Host names this machine, and answers the others with
// refuse. The Host is r.Host, the Host header or the host of an absolute request URI. A nil
// refuse answers Refused with Message as plain text.
func Only(h http.Handler, refuse func(http.ResponseWriter)) http.Handler {
	if refuse == nil {
		refuse = func(w http.ResponseWriter) { http.Error(w, Message, Refused) }
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Name(r.Host) {
			refuse(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

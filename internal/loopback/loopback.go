// Package loopback holds the access rule of a router listener without a token (admin.listen,
// http.listen): such a listener is bound to a loopback address, and it answers only requests
// addressed to a loopback name, so a web page whose DNS name an attacker re-points to
// 127.0.0.1 (DNS rebinding) reaches nothing through the victim's browser.
package loopback

import (
	"net"
	"net/http"
	"strings"
)

// Name reports whether host names this machine: "localhost" or a loopback IP, with or
// without a port, an IPv6 address with or without brackets. A Host header of any other
// name, an empty one included, is not this machine's.
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

// Refused is the answer to a request for another name: 421 Misdirected Request (the
// request was meant for a server this one is not).
const Refused = http.StatusMisdirectedRequest

// Message is the fixed text of a refusal (the Host sent is not echoed).
const Message = "misdirected request: this listener has no token and answers only requests for 127.0.0.1, [::1] or localhost"

// Only serves h to requests whose Host (r.Host: the Host header, or the host of an
// absolute request URI) names this machine and answers the others with refuse; a nil
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

package console

import (
	"bytes"
	"net/http"
)

// view is what every page's template gets.
type view struct {
	Title    string
	Page     string
	CSRF     string // the form token of the browser's CSRF cookie
	LoggedIn bool   // a login session, so the page offers to log out
	Data     any
}

// render executes page into a buffer, so that a template error is a 500 and never half a
// page, and writes it with status.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, title string, by who, data any) {
	v := view{Title: title, Page: page, CSRF: c.csrfToken(w, r), LoggedIn: by == session, Data: data}
	var b bytes.Buffer
	if err := c.pages[page].Execute(&b, v); err != nil {
		c.cfg.Logger.Error("console: render", err, nil)
		http.Error(w, "console: render "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// message renders a short page that says what an action did, or why it did not.
func (c *Console) message(w http.ResponseWriter, r *http.Request, status int, by who, title string, lines []string, links ...link) {
	c.render(w, r, status, "message", title, by, messageData{Lines: lines, Links: links, Error: status >= 400})
}

type messageData struct {
	Lines []string
	Links []link
	Error bool
}

type link struct{ Href, Text string }

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

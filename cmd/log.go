package cmd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// newLogger returns the logger for withlock's own messages on w: one line
// each, "withlock: msg key=value" in text format or one JSON object per
// line in json format. verbose lowers the level to Debug.
func newLogger(w io.Writer, format string, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(&textHandler{w: w, level: level, mu: new(sync.Mutex)})
}

// textHandler writes "withlock: [warning: ]msg key=value ..." lines, the
// shape Unix tools use for their diagnostics.
type textHandler struct {
	w     io.Writer
	level slog.Level
	mu    *sync.Mutex
	attrs []slog.Attr
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *textHandler) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	b.WriteString("withlock: ")
	if r.Level == slog.LevelWarn {
		b.WriteString("warning: ")
	}
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		v := a.Value.Resolve().String()
		if v == "" || strings.ContainsAny(v, " \t\"=") {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", a.Key, v)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(b.Bytes())
	return err
}

func (h *textHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), as...)
	return &c
}

// Groups are not used by withlock; attributes are kept flat.
func (h *textHandler) WithGroup(string) slog.Handler { return h }

// redactor hides secrets in everything written through it. Every line
// withlock writes goes through one, so that no error message from a driver
// can leak a password, wherever it came from.
//
// It also keeps the one status line a person at a terminal may see while
// withlock waits (setLine): a message written meanwhile clears the line
// first and draws it again after, so that the two never mix.
type redactor struct {
	w       io.Writer
	secrets []string
	mu      sync.Mutex
	line    string // the status line on the terminal now, "" when none
}

// shortSecret is the length below which a secret is hidden only where it
// stands as a word of its own: a password "p" must not turn every
// "postgres" into "xxxxxostgres", and a password that short hides nothing
// anyway.
const shortSecret = 6

func (r *redactor) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.redact(string(p))
	if r.line != "" {
		s = clearLine + s + r.line
	}
	if _, err := io.WriteString(r.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// clearLine returns a terminal's cursor to the start of its line and
// erases the line.
const clearLine = "\r\x1b[K"

// setLine shows line in place of the status line shown so far, or erases
// it (line ""). Only for a terminal: see waitLine.
func (r *redactor) setLine(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if line == "" && r.line == "" {
		return
	}
	r.line = r.redact(line)
	io.WriteString(r.w, clearLine+r.line)
}

// redact hides r's secrets in s.
func (r *redactor) redact(s string) string {
	for _, secret := range r.secrets {
		// A secret that is not UTF-8 (?password=%D2) cannot be a regexp, and
		// is hidden wherever it stands.
		if len(secret) >= shortSecret || !utf8.ValidString(secret) {
			s = strings.ReplaceAll(s, secret, "xxxxx")
			continue
		}
		re := regexp.MustCompile(`(^|[^\pL\pN])` + regexp.QuoteMeta(secret) + `($|[^\pL\pN])`)
		for prev := ""; prev != s; {
			prev, s = s, re.ReplaceAllString(s, "${1}xxxxx${2}")
		}
	}
	return s
}

// urlSecrets returns the password of a backend URL, as written and
// unescaped, from its user info or a password query parameter.
func urlSecrets(raw string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 1 {
			out = append(out, s)
			if e := url.QueryEscape(s); e != s {
				out = append(out, e)
			}
			if e := url.PathEscape(s); e != s {
				out = append(out, e)
			}
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Unparsable: hide everything between "://" and "@".
		if i, j := strings.Index(raw, "://"), strings.LastIndex(raw, "@"); i >= 0 && j > i+3 {
			add(raw[i+3 : j])
		}
		return out
	}
	if p, ok := u.User.Password(); ok {
		add(p)
	}
	for k, vs := range u.Query() {
		if strings.EqualFold(k, "password") {
			for _, v := range vs {
				add(v)
			}
		}
	}
	return out
}

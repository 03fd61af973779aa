package postgres

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// PostgreSQL has nowhere to store a record next to an advisory lock; what
// another session can read of the holder is its row in pg_stat_activity.
// application_name holds 63 bytes ("withlock <pid>@<host> <NAME>", cut),
// and query holds the text of the session's last statement. So every
// statement a holder runs while it holds the lock (the one that takes it,
// and each check) carries the holder's record as its first value: a string
// literal that pgx writes into the statement (the simple protocol quotes
// it; nothing is pasted by hand), and that pg_stat_activity.query shows
// until the next check replaces it with the same record.

// record is a holder's record, as JSON.
type record struct {
	// Withlock is the record's format, 1; a statement whose first literal
	// is JSON without it is someone else's.
	Withlock int    `json:"withlock"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	// Name is the lock's name, which List cannot get back from the keys;
	// it is believed only where its keys are the lock's. Left out when it
	// does not fit.
	Name string `json:"name,omitempty"`
	// At is when the lock was granted, by the server's clock. The statement
	// that takes the lock cannot know it yet; status then reads it from
	// pg_stat_activity.state_change, the end of that statement.
	At      *time.Time `json:"at,omitempty"`
	Command []string   `json:"command"`
}

// maxLiteral bounds a record's literal, quotes included, so that it fits
// in pg_stat_activity.query: the server keeps track_activity_query_size
// (default 1024) bytes of the statement, whose first value the record is.
const maxLiteral = 960

// literalLen is the length of s as a quoted SQL string literal.
func literalLen(s string) int {
	return len(s) + strings.Count(s, "'") + 2
}

func (r record) encode() string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // shorter, and as readable as it can be in psql
	enc.Encode(r)            // cannot fail: strings, ints and a time
	return strings.TrimSuffix(b.String(), "\n")
}

// fit returns r's JSON, cut to fit maxLiteral: a long command loses its
// last arguments, and the argument it is cut in ends in "…"; a name that
// cannot fit even then is left out (List then shows the lock's keys).
func (r record) fit() string {
	if s := r.encode(); literalLen(s) <= maxLiteral {
		return s
	}
	argv := r.Command
	r.Command = []string{}
	if literalLen(r.encode()) > maxLiteral {
		r.Name = ""
	}
	fits := func(cmd []string) bool {
		r := r
		r.Command = cmd
		return literalLen(r.encode()) <= maxLiteral
	}
	for _, arg := range argv {
		next := append(r.Command, arg)
		if fits(next) {
			r.Command = next
			continue
		}
		// The longest prefix of arg that fits, by binary search on bytes,
		// kept whole runes.
		lo, hi := 0, len(arg)
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if fits(append(r.Command, cutBytes(arg, mid)+"…")) {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		if fits(append(r.Command, cutBytes(arg, lo)+"…")) {
			r.Command = append(r.Command, cutBytes(arg, lo)+"…")
		}
		break
	}
	return r.encode()
}

// cutBytes returns s's first n bytes, less any rune they split.
func cutBytes(s string, n int) string {
	s = s[:n]
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// parseRecord reads the record that a withlock statement carries first,
// from the text pg_stat_activity shows of it: "select", then the literal.
// It reports false for any other statement, and for a record the server
// cut short (a track_activity_query_size below maxLiteral).
func parseRecord(query string) (record, bool) {
	rest, ok := strings.CutPrefix(strings.TrimLeft(query, " \t\n"), "select")
	if !ok {
		return record{}, false
	}
	rest = strings.TrimLeft(rest, " \t\n")
	if !strings.HasPrefix(rest, "'") {
		return record{}, false
	}
	var lit strings.Builder
	for i := 1; i < len(rest); i++ {
		if rest[i] != '\'' {
			lit.WriteByte(rest[i])
			continue
		}
		if i+1 < len(rest) && rest[i+1] == '\'' { // a quote, doubled
			lit.WriteByte('\'')
			i++
			continue
		}
		var r record
		if json.Unmarshal([]byte(lit.String()), &r) != nil || r.Withlock != 1 {
			return record{}, false
		}
		return r, true
	}
	return record{}, false // no closing quote: cut short
}

// record is this holder's record (see record.go) for a lock on name,
// granted at at (nil while it is being taken).
func (b *backend) record(name string, at *time.Time) string {
	h := b.opts.Holder
	r := record{Withlock: 1, Host: h.Host, PID: h.PID, Name: name, Command: h.Command}
	if at != nil {
		t := at.UTC()
		r.At = &t
	}
	return r.fit()
}

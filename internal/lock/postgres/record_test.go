package postgres

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// quote is how pgx's simple protocol writes a string into a statement.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestRecordRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 23, 10, 0, 0, 123456000, time.UTC)
	for _, r := range []record{
		{Withlock: 1, Host: "web-1", PID: 42, Name: "job", Command: []string{"migrate", "up"}},
		{Withlock: 1, Host: "h", PID: 1, Name: `it's "quoted"; --`, At: &at, Command: []string{"sh", "-c", "echo 'a' \\' \n\x00 ü"}},
		{Withlock: 1, Host: "h", PID: 1, Name: "n", Command: nil},
	} {
		// As pg_stat_activity shows the statement: pgx puts a space either side.
		q := "select  " + quote(r.fit()) + " ::text as withlock, x.pid"
		got, ok := parseRecord(q)
		if !ok {
			t.Fatalf("parseRecord(%q) failed", q)
		}
		if got.Host != r.Host || got.PID != r.PID || got.Name != r.Name || !slices.Equal(got.Command, r.Command) ||
			(got.At == nil) != (r.At == nil) || r.At != nil && !got.At.Equal(*r.At) {
			t.Errorf("round trip of %+v: got %+v", r, got)
		}
	}
}

func TestRecordNotOurs(t *testing.T) {
	for _, q := range []string{
		"",
		"SELECT pg_try_advisory_lock($1, $2)",
		"select 1",
		"select '{\"host\":\"x\"}'", // JSON, but not a record
		"select  '{\"withlock\":1,\"host\":\"x\",\"pi", // cut short by the server
		"<insufficient privilege>",
	} {
		if r, ok := parseRecord(q); ok {
			t.Errorf("parseRecord(%q) = %+v, true; want false", q, r)
		}
	}
}

// TestRecordFits: however long the command, the record fits in the part
// of the statement the server keeps; the command is cut, its last kept
// argument marked with "…", whole runes only.
func TestRecordFits(t *testing.T) {
	long := strings.Repeat("ü'x", 400)
	argv := []string{"sh", "-c", long, "never"}
	r := record{Withlock: 1, Host: "web-1", PID: 42, Name: "job", Command: argv}
	lit := quote(r.fit())
	if len(lit) > maxLiteral {
		t.Fatalf("literal of %d bytes; want at most %d", len(lit), maxLiteral)
	}
	got, ok := parseRecord("select " + lit)
	if !ok {
		t.Fatal("the cut record does not parse")
	}
	if len(got.Command) != 3 || got.Command[0] != "sh" || got.Command[1] != "-c" {
		t.Fatalf("cut command %q; want sh -c and a cut third argument", got.Command)
	}
	third := got.Command[2]
	if !strings.HasSuffix(third, "…") || !strings.HasPrefix(long, strings.TrimSuffix(third, "…")) || !utf8.ValidString(third) {
		t.Errorf("cut argument %q; want a prefix of the argument, then …", third)
	}
	if len(lit) < maxLiteral-10 {
		t.Errorf("literal of %d bytes: cut more than needed", len(lit))
	}
	if got.Name != "job" {
		t.Errorf("name %q after the cut; want it kept", got.Name)
	}

	// A name too long to fit with the host is left out rather than cut:
	// List could not match a cut name with its keys.
	r = record{Withlock: 1, Host: "h", PID: 1, Name: strings.Repeat("'", 255), Command: []string{"true"}}
	r.Host = strings.Repeat("h", 500)
	lit = quote(r.fit())
	if got, ok := parseRecord("select " + lit); !ok || got.Name != "" || len(lit) > maxLiteral {
		t.Errorf("record with a long name and host: %d bytes, name %q, ok %v; want the name left out", len(lit), got.Name, ok)
	}
}

// TestBoundArgs: the server-side bound's values, as boundSQL sets them.
func TestBoundArgs(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want string
	}{
		{15 * time.Second, "[15000 8 3]"}, // keepalives: idle 7.5s and interval 2.5s, rounded up
		{12 * time.Second, "[12000 6 2]"},
		{100 * time.Millisecond, "[100 1 1]"}, // at least a second each
		{time.Hour, "[3600000 1800 600]"},
	} {
		if got := fmt.Sprint(boundArgs(c.ttl)); got != c.want {
			t.Errorf("boundArgs(%v) = %s, want %s", c.ttl, got, c.want)
		}
	}
}

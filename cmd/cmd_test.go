package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/exec"
	"github.com/withlock/withlock/internal/lock"
)

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		dash int // cobra's ArgsLenAtDash: -1 without "--"
		name string
		argv []string // nil: a usage error
	}{
		{[]string{"job", "migrate", "up"}, 1, "job", []string{"migrate", "up"}},
		{[]string{"job", "true"}, 1, "job", []string{"true"}},
		// After "--" everything is the command's, even flags and "--".
		{[]string{"job", "sh", "-c", "x", "--", "-n"}, 1, "job", []string{"sh", "-c", "x", "--", "-n"}},
		{[]string{"a b", "--db"}, 1, "a b", []string{"--db"}},
		{nil, -1, "", nil},
		{[]string{"job"}, -1, "", nil},
		{[]string{"job", "true"}, -1, "", nil},
		{[]string{}, 0, "", nil},
		{[]string{"true"}, 0, "", nil},
		{[]string{"job"}, 1, "", nil},
		{[]string{"a", "b", "true"}, 2, "", nil},
		// A command misspelt, without "--": a usage error, not a lock.
		{[]string{"stauts"}, -1, "", nil},
		{[]string{"releas", "hello"}, -1, "", nil},
	} {
		name, argv, err := splitArgs(tc.args, tc.dash)
		desc := fmt.Sprintf("splitArgs(%q, %d)", tc.args, tc.dash)
		switch {
		case tc.argv == nil && !errors.Is(err, errUsage):
			t.Errorf("%s = %q, %q, %v; want a usage error", desc, name, argv, err)
		case tc.argv != nil && (err != nil || name != tc.name || !slices.Equal(argv, tc.argv)):
			t.Errorf("%s = %q, %q, %v; want %q, %q", desc, name, argv, err, tc.name, tc.argv)
		}
		if err != nil && exitCode(err, exitNotAcquired) != exitUsage {
			t.Errorf("%s: %v exits %d, want %d", desc, err, exitCode(err, exitNotAcquired), exitUsage)
		}
	}
}

func TestNearCommand(t *testing.T) {
	for word, want := range map[string]string{"stauts": "status", "releas": "release", "chekc": "check", "verison": "version", "status": "", "job": "", "nightly": "", "ru": ""} {
		if got := nearCommand(word); got != want {
			t.Errorf("nearCommand(%q) = %q, want %q", word, got, want)
		}
	}
}

func TestExitCode(t *testing.T) {
	// The errors as they reach exitCode: Client.Acquire's gaveUp joins the
	// cause of the wait's end with the last backend error.
	gaveUp := func(cause, last error) error { return fmt.Errorf("%w (last: %w)", cause, last) }
	timedOut := fmt.Errorf("%w after 5s waiting for %q", errTimedOut, "job")
	held := lock.Errorf(lock.ErrHeld, "%q is held elsewhere (--no-wait)", "job")
	unreachable := lock.Errorf(lock.ErrUnavailable, "cannot reach postgres at db:5432 (connection refused)")
	refused := lock.Errorf(lock.ErrRefused, "postgres at db:5432 refused: password authentication failed")
	lost := lock.Errorf(lock.ErrLost, "postgres ended the session")
	sigint, sigterm := signalError{syscall.SIGINT}, signalError{syscall.SIGTERM}

	for _, tc := range []struct {
		desc     string
		err      error
		conflict int
		want     int
	}{
		{"SIGINT", sigint, 75, 130},
		{"SIGTERM", sigterm, 75, 143},
		{"SIGHUP", signalError{syscall.SIGHUP}, 75, 129},
		{"signal while held elsewhere", gaveUp(sigterm, held), 75, 143},
		{"signal while unreachable", gaveUp(sigint, unreachable), 75, 130},
		{"signal, quiet conflicts", gaveUp(sigint, held), 0, 130},
		{"signal and lost", errors.Join(lost, sigterm), 75, 143},

		{"lost", lost, 75, 70},
		{"lost, reported", reported{lost}, 75, 70},
		{"bare ErrLost", lock.ErrLost, 0, 70},

		{"not found", fmt.Errorf("start: %w", exec.ErrNotFound), 75, 127},
		{"not executable", fmt.Errorf("start: %w", exec.ErrNotExecutable), 75, 126},

		{"unreachable", unreachable, 75, 69},
		{"unreachable, retried", fmt.Errorf("%w; retried for 15s", unreachable), 0, 69},
		{"refused", refused, 75, 69},
		{"timed out while unreachable", gaveUp(timedOut, unreachable), 75, 69},
		{"timed out while unreachable, quiet conflicts", gaveUp(timedOut, unreachable), 0, 69},
		{"timed out while refused", gaveUp(timedOut, refused), 0, 69},

		{"held, --no-wait", held, 75, 75},
		{"held, --conflict-exit-code 0", held, 0, 0},
		{"held, --conflict-exit-code 3", held, 3, 3},
		{"timed out", timedOut, 75, 75},
		{"timed out while held", gaveUp(timedOut, held), 75, 75},
		{"timed out while held, quiet conflicts", gaveUp(timedOut, held), 0, 0},
		{"timed out while the server could not vouch", gaveUp(timedOut, lock.Errorf(lock.ErrUnsettled, "redis at r:6379 has been up for 1s")), 0, 69},

		{"usage", usagef("missing NAME and -- COMMAND"), 0, 64},
		{"bad name", lock.CheckName(""), 0, 64},
		{"bad URL", lock.Errorf(lock.ErrUsage, "unknown scheme %q", "nope"), 0, 64},
		{"server cannot list its locks", lock.Errorf(lock.ErrNotSupported, "mysql at db:3306 cannot list its locks"), 0, 64},
		{"release could not break", lock.Errorf(lock.ErrHeld, "held on another host"), 75, 75},
		{"release not allowed", lock.Errorf(lock.ErrRefused, "permission denied to terminate process"), 75, 69},
		{"cobra's complaint", errors.New("unknown flag: --frobnicate"), 0, 64},
		{"cobra's complaint about a value", errors.New(`invalid argument "5x" for "-t, --timeout" flag: time: unknown unit "x" in duration "5x"`), 75, 64},
	} {
		if got := exitCode(tc.err, tc.conflict); got != tc.want {
			t.Errorf("%s: exitCode(%v, %d) = %d, want %d", tc.desc, tc.err, tc.conflict, got, tc.want)
		}
	}
}

func TestQuiet(t *testing.T) {
	held := lock.Errorf(lock.ErrHeld, "held")
	for _, tc := range []struct {
		desc string
		err  error
		code int
		want bool
	}{
		{"signal", fmt.Errorf("%w (last: %w)", signalError{syscall.SIGINT}, held), 130, true},
		{"conflict declared a success", held, 0, true},
		{"conflict", held, 75, false},
		{"unreachable", lock.Errorf(lock.ErrUnavailable, "down"), 69, false},
	} {
		if got := quiet(tc.err, tc.code); got != tc.want {
			t.Errorf("%s: quiet(%v, %d) = %v, want %v", tc.desc, tc.err, tc.code, got, tc.want)
		}
	}
}

func TestURLSecrets(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want []string // at least these
	}{
		{"postgres://u:hunter2@db/app", []string{"hunter2"}},
		{"postgres://u:p%40ss%2Fw0rd@db/app", []string{"p@ss/w0rd", "p%40ss%2Fw0rd"}},
		{"postgres://db/app?sslmode=disable&password=hunter2", []string{"hunter2"}},
		{"postgres://db/app?PassWord=hunter2", []string{"hunter2"}},
		{"postgres://db/app?password=a+b%26c", []string{"a b&c", "a+b%26c"}},
		{"postgres://u:pa%zz@db/app", []string{"u:pa%zz"}}, // unparsable
	} {
		got := urlSecrets(tc.url)
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("urlSecrets(%q) = %q, without %q", tc.url, got, w)
			}
		}
	}
	for _, u := range []string{"postgres://u@db/app", "postgres://db/app?sslmode=disable", "file:///var/lock", "postgres://u:@db/app"} {
		if got := urlSecrets(u); len(got) != 0 {
			t.Errorf("urlSecrets(%q) = %q, want none", u, got)
		}
	}
}

// redact writes msg through a redactor for url and returns what comes out.
func redact(t *testing.T, url, msg string) string {
	t.Helper()
	var out bytes.Buffer
	r := &redactor{w: &out, secrets: urlSecrets(url)}
	n, err := io.WriteString(r, msg)
	if n != len(msg) || err != nil {
		t.Errorf("Write(%q) = %d, %v; want %d, nil", msg, n, err, len(msg))
	}
	return out.String()
}

func TestRedactor(t *testing.T) {
	for _, tc := range []struct {
		desc, url, msg string
		secrets        []string // none of these may come out
		want           string   // if not empty, exactly this must
	}{
		{"userinfo", "postgres://u:hunter2@db/app",
			"cannot parse postgres://u:hunter2@db/app: password hunter2 rejected\n",
			[]string{"hunter2"}, "cannot parse postgres://u:xxxxx@db/app: password xxxxx rejected\n"},
		{"query", "postgres://db/app?password=hunter2",
			"cannot parse postgres://db/app?password=hunter2\n",
			[]string{"hunter2"}, "cannot parse postgres://db/app?password=xxxxx\n"},
		{"escaped, as written and unescaped", "postgres://u:p%40ss%2Fw0rd@db/app",
			"bad: postgres://u:p%40ss%2Fw0rd@db/app, password p@ss/w0rd, path p@ss%2Fw0rd\n",
			[]string{"p%40ss%2Fw0rd", "p@ss/w0rd", "p@ss%2Fw0rd", "w0rd"}, ""},
		{"space, query-escaped", "postgres://db/app?password=my+secret+pw",
			"bad: postgres://db/app?password=my+secret+pw (password \"my secret pw\")\n",
			[]string{"my+secret+pw", "my secret pw"}, ""},
		{"space, path-escaped", "postgres://u:my%20secret%20pw@db/app",
			"bad: postgres://u:my%20secret%20pw@db/app (password \"my secret pw\")\n",
			[]string{"my%20secret%20pw", "my secret pw"}, ""},
		// A short password hides only where it stands alone, so that "p"
		// does not mangle "postgres".
		{"short password", "postgres://u:p@db/app",
			"cannot reach postgres://u:p@db/app as p\n",
			[]string{":p@", " p\n"}, "cannot reach postgres://u:xxxxx@db/app as xxxxx\n"},
		{"short password, repeated", "postgres://u:ab@db/app",
			"ab ab,ab abc cab\n",
			nil, "xxxxx xxxxx,xxxxx abc cab\n"},
		{"unparsable", "postgres://u:pa%zz@db/app",
			"cannot parse postgres://u:pa%zz@db/app\n",
			[]string{"pa%zz"}, ""},
		{"no password", "postgres://u@db/app",
			"cannot reach postgres://u@db/app\n",
			nil, "cannot reach postgres://u@db/app\n"},
	} {
		got := redact(t, tc.url, tc.msg)
		for _, s := range tc.secrets {
			if strings.Contains(got, s) {
				t.Errorf("%s: %q shows %q", tc.desc, got, s)
			}
		}
		if tc.want != "" && got != tc.want {
			t.Errorf("%s: %q, want %q", tc.desc, got, tc.want)
		}
	}
}

func TestTextHandler(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		verbose bool
		log     func(l *slog.Logger)
		want    string
	}{
		{"info", false, func(l *slog.Logger) { l.Info("acquired", "lock", "job", "took", 1500*time.Millisecond) },
			"withlock: acquired lock=job took=1.5s\n"},
		{"warning", false, func(l *slog.Logger) { l.Warn("could not renew the lock; retrying") },
			"withlock: warning: could not renew the lock; retrying\n"},
		{"error", false, func(l *slog.Logger) { l.Error(`"job" is held elsewhere (--no-wait)`) },
			"withlock: \"job\" is held elsewhere (--no-wait)\n"},
		{"quoted values", false, func(l *slog.Logger) {
			l.Info("m", "a", "two words", "b", "", "c", `say "hi"`, "d", "k=v", "e", "tab\there")
		}, `withlock: m a="two words" b="" c="say \"hi\"" d="k=v" e="tab\there"` + "\n"},
		{"attrs of With", false, func(l *slog.Logger) { l.With("lock", "my job").Info("kept", "n", 3) },
			"withlock: kept lock=\"my job\" n=3\n"},
		{"debug hidden", false, func(l *slog.Logger) { l.Debug("connected") }, ""},
		{"debug with -v", true, func(l *slog.Logger) { l.Debug("connected", "addr", "db:5432") },
			"withlock: connected addr=db:5432\n"},
	} {
		var out bytes.Buffer
		tc.log(newLogger(&out, "text", tc.verbose))
		if got := out.String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.desc, got, tc.want)
		}
	}
}

func TestJSONHandler(t *testing.T) {
	var out bytes.Buffer
	l := newLogger(&out, "json", false)
	l.Warn("could not renew", "lock", "job")
	l.Debug("hidden")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %q", len(lines), out.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("%q: %v", lines[0], err)
	}
	ts, _ := rec["time"].(string)
	if _, err := time.Parse(time.RFC3339, ts); err != nil {
		t.Errorf("time %q: %v", rec["time"], err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "could not renew" || rec["lock"] != "job" {
		t.Errorf("%q: want level WARN, msg and lock", lines[0])
	}
}

// TestLoggerThroughRedactor: a password that reaches a log line in either
// format does not reach the output.
func TestLoggerThroughRedactor(t *testing.T) {
	const dbURL = "postgres://u:hunter2@db/app"
	for _, format := range []string{"text", "json"} {
		var out bytes.Buffer
		l := newLogger(&redactor{w: &out, secrets: urlSecrets(dbURL)}, format, true)
		l.Error("cannot reach "+dbURL, "url", dbURL)
		l.Log(context.Background(), slog.LevelDebug, "password", "pw", "hunter2")
		if strings.Contains(out.String(), "hunter2") {
			t.Errorf("%s: %q shows the password", format, out.String())
		}
	}
}

// TestTimeoutCause: the cause of a wait that --timeout ended reads as time
// running out however a driver hands it back. net/http returns the
// context's cause, not its error, inside its own error; the backend must
// still see a timeout there, so that a server that had not answered yet is
// not reported as unreachable (exit 69) but as not acquired in time (75).
func TestTimeoutCause(t *testing.T) {
	cause := timeoutError{200 * time.Millisecond, "job"}
	if got, want := cause.Error(), `timed out after 200ms waiting for "job"`; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if !errors.Is(cause, errTimedOut) || !errors.Is(cause, context.DeadlineExceeded) {
		t.Errorf("%v: want errTimedOut and context.DeadlineExceeded", cause)
	}
	fromHTTP := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/namespaces/ns/leases/job", Err: cause}
	if got := lock.Reason(fromHTTP); got != "timed out" {
		t.Errorf("lock.Reason(%v) = %q, want %q", fromHTTP, got, "timed out")
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), time.Millisecond, cause)
	defer cancel()
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Errorf("context.Cause = %v, want a DeadlineExceeded", context.Cause(ctx))
	}
}

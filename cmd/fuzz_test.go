package cmd

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// FuzzOpenURL opens fuzzed URLs of every scheme, with a password in the
// user part or in ?password=, the way `--db` hands them to lock.Open: it
// never panics, every error is a usage error or says the backend is not
// supported, and neither the error nor what withlock prints of it shows
// the password. Open does not connect, so no server is needed. `go test
// -fuzz FuzzOpenURL ./cmd/` searches for more; the seeds run in make test.
func FuzzOpenURL(f *testing.F) {
	for _, seed := range []struct {
		scheme, rest string
		inQuery      bool
	}{
		{"postgres", "db.example:5432/app?sslmode=verify-full", false},
		{"postgresql", "db/app?target_session_attrs=standby", true},
		{"postgres", "[::1/app", false},
		{"postgres", "db/app?connect_timeout=x", true},
		{"postgres", "db:99999/app", false},
		{"mysql", "db:3306/app?tls=maybe", false},
		{"mysql", "db/app?max_holders=%zz", true},
		{"redis", "db:6379/99?wait_replicas=x", false},
		{"rediss", "db/0?tls_ca=/nonexistent", true},
		{"mongodb", "db/withlock?authSource=admin&replicaSet=", false},
		{"mongodb+srv", "db", true},
		{"etcd", "a:2379,b:2379?dial_timeout=x", false},
		{"etcd", ":::", true},
		{"file", "/var/lock?x=1", false},
		{"k8s", "ns", false},
		{"unknown", "x", false},
	} {
		f.Add(seed.scheme, seed.rest, "Sup3rSecretPw", seed.inQuery)
	}
	f.Fuzz(func(t *testing.T, scheme, rest, pw string, inQuery bool) {
		// A password of letters and digits, long enough for the redactor to
		// hide it wherever it stands, that the rest does not spell out.
		if len(pw) < 8 || strings.Trim(pw, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != "" ||
			strings.Contains(strings.ToLower(scheme+rest), strings.ToLower(pw[:4])) {
			return
		}
		raw := scheme + "://u:" + pw + "@" + rest
		if inQuery {
			sep := "?"
			if strings.Contains(rest, "?") {
				sep = "&"
			}
			raw = scheme + "://" + rest + sep + "password=" + pw
		}
		c, err := lock.Open(raw, lock.Options{})
		if err == nil {
			c.Close()
			return
		}
		if !errors.Is(err, lock.ErrUsage) && !errors.Is(err, lock.ErrNotSupported) {
			t.Errorf("lock.Open(%q): %v, neither a usage error nor unsupported", raw, err)
		}
		var out bytes.Buffer
		r := &redactor{w: &out, secrets: urlSecrets(raw)}
		r.Write([]byte("withlock: " + err.Error() + "\n"))
		if strings.Contains(out.String(), pw) {
			t.Errorf("lock.Open(%q): withlock prints %q, with the password", raw, out.String())
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("lock.Open(%q): %q, with the password", raw, err)
		}
	})
}

// FuzzDurations runs withlock with fuzzed --ttl, --kill-after, --timeout
// and --hold-at-least on a file:// lock: it never panics, exits 64 exactly
// when the contract refuses the values (unparsable, negative, a ttl that
// is not positive, a kill-after that is not shorter than the ttl), and
// otherwise runs the command. `go test -fuzz FuzzDurations ./cmd/`
// searches for more; the seeds run in make test.
func FuzzDurations(f *testing.F) {
	for _, seed := range [][4]string{
		{"15s", "5s", "0", "0"},
		{"2s", "", "1s", "0"},
		{"3s", "3s", "", ""},
		{"1s", "2s", "", ""},
		{"0", "", "", ""},
		{"-1s", "", "", ""},
		{"1h", "0", "", ""},
		{"10", "", "", ""},
		{"1s", "", "-5s", ""},
		{"1s", "", "", "-1ms"},
		{"1.5s", "500ms", "1m", "10ms"},
		{"9999999999999h", "", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	dir := filepath.Join(f.TempDir(), "locks")
	f.Fuzz(func(t *testing.T, ttl, killAfter, timeout, holdAtLeast string) {
		args := []string{"--db", "file://" + dir, "--connect-timeout", "2s"}
		valid := true
		var d [4]time.Duration
		for i, v := range []struct{ flag, value string }{{"--ttl", ttl}, {"--kill-after", killAfter}, {"--timeout", timeout}, {"--hold-at-least", holdAtLeast}} {
			if v.value == "" {
				continue
			}
			var err error
			if d[i], err = time.ParseDuration(v.value); err != nil || d[i] < 0 {
				valid = false
			}
			args = append(args, v.flag+"="+v.value)
		}
		if ttl == "" {
			d[0] = lock.DefaultTTL
		}
		if d[0] <= 0 || killAfter != "" && (d[1] == 0 || d[1] >= d[0]) {
			valid = false
		}
		if valid && (d[0] < 100*time.Millisecond || d[3] > time.Second) {
			return // works, but too slow to run here (a ttl too short to keep exits 69 or 70)
		}
		args = append(args, "job", "--", "true")
		var stderr bytes.Buffer
		code := run(args, &bytes.Buffer{}, &stderr)
		switch {
		case !valid && code != exitUsage:
			t.Errorf("withlock %q: exit %d, want %d", args, code, exitUsage)
		case valid && code == exitUsage:
			t.Errorf("withlock %q: exit 64 (%s), but the durations are valid", args, strings.TrimSpace(stderr.String()))
		}
	})
	os.RemoveAll(dir)
}

package testenv

import (
	"errors"
	"os"
	"strconv"
	"testing"
)

// RequirePostgres starts a cluster with [StartPostgres] and closes it when t's
// test ends. If PostgreSQL is not installed, t fails under CI (CI=true) and is
// skipped elsewhere, with the install hint either way; any other error fails t.
func RequirePostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := StartPostgres()
	if err != nil {
		missing(t, err, ErrNoPostgres)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("testenv: close postgres: %v", err)
		}
	})
	return p
}

// RequireNPM returns [NPMDir], with the same policy as RequirePostgres when node
// or npm is missing.
func RequireNPM(t testing.TB) string {
	t.Helper()
	dir, err := NPMDir()
	if err != nil {
		missing(t, err, ErrNoNode)
	}
	return dir
}

// missing ends t: skipped if err is the sentinel (a dependency not installed) and
// we are not under CI, failed otherwise.
func missing(t testing.TB, err, sentinel error) {
	t.Helper()
	if errors.Is(err, sentinel) && !InCI() {
		t.Skip(err)
	}
	t.Fatal(err)
}

// InCI reports whether the tests run under CI, where a missing dependency must
// fail tests instead of skipping them: $CI is set to anything but a false value
// ("true" on GitHub Actions and GitLab).
func InCI() bool {
	v := os.Getenv("CI")
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err != nil || b
}

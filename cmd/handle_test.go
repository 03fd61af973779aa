package cmd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// TestHandle: a handle reads back as it was written, holds no secret of
// the backend URL, and names its backend whatever user or parameters
// reach it.
func TestHandle(t *testing.T) {
	url := "postgres://deploy:hunter22@DB.internal:5432/app?sslmode=require&password=hunter22"
	h := handle{V: 1, ID: "id", Name: "dbmigration", Backend: backendID(url), Mode: lock.Exclusive,
		Host: "ci-runner", PID: 42, Start: 7, Token: 3, Acquired: time.Unix(1, 0).UTC(), MaxHold: "30m0s"}
	s := h.String()
	if !strings.HasPrefix(s, handlePrefix) || strings.ContainsAny(s, " \n'\"$") {
		t.Errorf("handle %q: want %s and nothing a shell would split or expand", s, handlePrefix)
	}
	got, err := parseHandle(" " + s + "\n")
	if err != nil || got != h {
		t.Fatalf("parseHandle(String()) = %+v, %v; want %+v", got, err, h)
	}
	if h.Backend != "postgres://db.internal:5432/app" {
		t.Errorf("backend %q: want the scheme, host and database alone", h.Backend)
	}
	for _, other := range []string{"postgresql://other@db.internal:5432/app", "postgres://db.internal:5432/app/"} {
		if err := h.checkBackend(other); err != nil {
			t.Errorf("%s: %v; want the same backend", other, err)
		}
	}
	if err := h.checkBackend("postgres://db.internal:5432/other"); !errors.Is(err, errUsage) {
		t.Errorf("another database: %v; want a usage error", err)
	}
	for _, bad := range []string{"", "wlh1.", "wlh1.!!", "dbmigration", handlePrefix + "e30"} {
		if _, err := parseHandle(bad); !errors.Is(err, errUsage) {
			t.Errorf("parseHandle(%q) = %v; want a usage error", bad, err)
		}
	}
}

// TestHandleMatches: the handle's holder is the keeper's host and pid, and
// its fencing token where both know one.
func TestHandleMatches(t *testing.T) {
	h := handle{Host: "a", PID: 1, Token: 5}
	for _, tc := range []struct {
		holder lock.Holder
		want   bool
	}{
		{lock.Holder{Host: "a", PID: 1, Token: 5}, true},
		{lock.Holder{Host: "a", PID: 1}, true},
		{lock.Holder{Host: "a", PID: 1, Token: 6}, false},
		{lock.Holder{Host: "b", PID: 1, Token: 5}, false},
		{lock.Holder{Host: "a", PID: 2, Token: 5}, false},
	} {
		if got := h.matches(tc.holder); got != tc.want {
			t.Errorf("matches(%+v) = %v, want %v", tc.holder, got, tc.want)
		}
	}
}

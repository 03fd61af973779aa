package main

import (
	"strings"
	"testing"
)

// A name that -backends does not know is refused, before any server
// starts, with the names it knows: the single servers' and the Redis
// set-ups'.
func TestBackendsUnknownNamesTheSetups(t *testing.T) {
	_, dbs, stop, err := startServers(t.TempDir(), []string{"redis clustre"})
	defer stop()
	if err == nil || dbs != nil {
		t.Fatalf("startServers(\"redis clustre\") = %v, %v; want an error", dbs, err)
	}
	for _, want := range []string{`"redis clustre"`, "postgres", `"redis cluster"`, `"redis sentinel"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

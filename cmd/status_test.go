package cmd

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var (
	t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	h1 = lock.Holder{Host: "web-1", PID: 4242, Command: []string{"migrate", "up"}, AcquiredAt: t0, ExpiresAt: t0.Add(15 * time.Second), Token: 7}
	h2 = lock.Holder{Host: "web-2", PID: 17}
)

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		st   lock.State
		want string
	}{
		{lock.State{Name: "job"}, "job: free"},
		{lock.State{Name: "job", Mode: lock.Exclusive, Holders: []lock.Holder{h1}},
			"job: held (exclusive) by web-1 pid 4242 since 2026-11-22T10:00:00Z until 2026-11-22T10:00:15Z, token 7: migrate up"},
		{lock.State{Name: "rep", Mode: lock.Semaphore, MaxHolders: 3, Holders: []lock.Holder{h1, h2}},
			"rep: held (semaphore of 3) by 2 holders: web-1 pid 4242, web-2 pid 17"},
		{lock.State{Key: "advisory lock (1, 2)", Holders: []lock.Holder{{PID: 9}}},
			"advisory lock (1, 2): held by pid 9"},
		{lock.State{Key: "advisory lock (1, 2)", Mode: lock.Exclusive, Holders: []lock.Holder{{Host: "10.0.0.7", Session: "postgres pid 77, user app"}}},
			"advisory lock (1, 2): held (exclusive) by 10.0.0.7 (postgres pid 77, user app)"},
		// Control characters keep to the line: quoted, as Go quotes.
		{lock.State{Name: "a\nb: free", Mode: lock.Exclusive, Holders: []lock.Holder{{Host: "h", PID: 1, Command: []string{"sh", "-c", "echo \x1b[2J"}}}},
			`"a\nb: free": held (exclusive) by h pid 1: sh -c "echo \x1b[2J"`},
		{lock.State{Name: "zü a"}, "zü a: free"},
	} {
		if got := describe(tc.st); got != tc.want {
			t.Errorf("describe(%+v)\n got %q\nwant %q", tc.st, got, tc.want)
		}
	}
}

// TestStatusJSON: the fields of docs/behaviour.md (Inspecting and
// breaking), null where unknown, the first
// holder repeated at the top.
func TestStatusJSON(t *testing.T) {
	for _, tc := range []struct {
		desc string
		st   lock.State
		want string
	}{
		{"free", lock.State{Name: "job"},
			`{"name":"job","backend":"redis","held":false,"mode":null,"max_holders":null,"holders":[],"host":null,"pid":null,"command":null,"acquired_at":null,"expires_at":null,"token":null}`},
		{"exclusive", lock.State{Name: "job", Mode: lock.Exclusive, Holders: []lock.Holder{h1}},
			`{"name":"job","backend":"redis","held":true,"mode":"exclusive","max_holders":1,"holders":[{"host":"web-1","pid":4242,"command":["migrate","up"],"acquired_at":"2026-11-22T10:00:00Z","expires_at":"2026-11-22T10:00:15Z","token":7}],"host":"web-1","pid":4242,"command":["migrate","up"],"acquired_at":"2026-11-22T10:00:00Z","expires_at":"2026-11-22T10:00:15Z","token":7}`},
		{"shared, partly unknown", lock.State{Name: "job", Mode: lock.Shared, Holders: []lock.Holder{h2, h1}},
			`{"name":"job","backend":"redis","held":true,"mode":"shared","max_holders":null,"holders":[{"host":"web-2","pid":17,"command":null,"acquired_at":null,"expires_at":null,"token":null},{"host":"web-1","pid":4242,"command":["migrate","up"],"acquired_at":"2026-11-22T10:00:00Z","expires_at":"2026-11-22T10:00:15Z","token":7}],"host":"web-2","pid":17,"command":null,"acquired_at":null,"expires_at":null,"token":null}`},
		{"a named lock's key is not shown", lock.State{Name: "job", Key: "withlock:job"},
			`{"name":"job","backend":"redis","held":false,"mode":null,"max_holders":null,"holders":[],"host":null,"pid":null,"command":null,"acquired_at":null,"expires_at":null,"token":null}`},
		{"no name", lock.State{Key: "advisory lock (1, 2)", Mode: lock.Exclusive, Holders: []lock.Holder{{PID: 9}}},
			`{"name":null,"key":"advisory lock (1, 2)","backend":"redis","held":true,"mode":"exclusive","max_holders":1,"holders":[{"host":null,"pid":9,"command":null,"acquired_at":null,"expires_at":null,"token":null}],"host":null,"pid":9,"command":null,"acquired_at":null,"expires_at":null,"token":null}`},
		{"a session, where the backend has one", lock.State{Key: "advisory lock (1, 2)", Mode: lock.Exclusive, Holders: []lock.Holder{{Host: "10.0.0.7", Session: "postgres pid 77"}}},
			`{"name":null,"key":"advisory lock (1, 2)","backend":"redis","held":true,"mode":"exclusive","max_holders":1,"holders":[{"host":"10.0.0.7","pid":null,"command":null,"acquired_at":null,"expires_at":null,"token":null,"session":"postgres pid 77"}],"host":"10.0.0.7","pid":null,"command":null,"acquired_at":null,"expires_at":null,"token":null,"session":"postgres pid 77"}`},
	} {
		b, err := json.Marshal(statusJSON(tc.st, "redis"))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.desc, b, tc.want)
		}
	}
}

func TestBackendName(t *testing.T) {
	for url, want := range map[string]string{
		"postgresql://u@h/db": "postgres", "rediss://h": "redis", "redis+sentinel://h/m": "redis", "mongodb+srv://c.example.net": "mongodb",
		"file:///var/lock": "file", "POSTGRES://h": "postgres",
	} {
		if got := backendName(url); got != want {
			t.Errorf("backendName(%q) = %q, want %q", url, got, want)
		}
	}
}

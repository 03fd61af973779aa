package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// judge's rule, on queues written as modes: x exclusive (withlock's, or a
// key without a record, as etcdctl lock's), s shared, 2 and 3 semaphores of
// that N.
func TestJudge(t *testing.T) {
	mk := func(modes string) []entry {
		var q []entry
		for i, m := range modes {
			e := entry{rev: int64(i + 1)}
			switch m {
			case 's':
				e.rec = &record{Mode: lock.Shared}
			case '2', '3':
				e.rec = &record{Mode: lock.Semaphore, MaxHolders: int(m - '0')}
			case 'e':
				e.rec = &record{Mode: lock.Exclusive}
			}
			q = append(q, e)
		}
		return q
	}
	for _, tc := range []struct {
		queue   string
		i       int
		holds   bool
		wait    int // when not holding: the index to wait on, -1 any
		isUsage bool
	}{
		{"x", 0, true, 0, false},
		{"xx", 1, false, 0, false},
		{"sex", 2, false, 1, false}, // exclusive waits on the key just before, as the recipe
		{"ss", 1, true, 0, false},
		{"sss", 2, true, 0, false},
		{"xs", 1, false, 0, false},
		{"sxs", 2, false, 1, false}, // a reader after a waiting writer waits for it
		{"sxs", 0, true, 0, false},
		{"esss", 3, false, 0, false},
		{"22", 1, true, 0, false},
		{"222", 2, false, -1, false}, // full: any earlier deletion may do
		{"2x2", 2, false, 1, false},
		{"x22", 1, false, 0, false},
		{"s2", 1, false, 0, false},
		{"2s", 1, false, 0, false},
		{"23", 1, false, 0, true}, // another N than the recorded one
		{"332", 2, false, 0, true},
		{"3x3", 2, false, 1, false},
	} {
		holds, wait, err := judge("job", mk(tc.queue), tc.i)
		if tc.isUsage {
			if !errors.Is(err, lock.ErrUsage) {
				t.Errorf("%s[%d]: %v; want ErrUsage", tc.queue, tc.i, err)
			}
			continue
		}
		if err != nil || holds != tc.holds || !holds && wait != tc.wait {
			t.Errorf("%s[%d]: holds %v, wait %d, %v; want %v, %d", tc.queue, tc.i, holds, wait, err, tc.holds, tc.wait)
		}
	}
	// The holders of a queue: the leading run that the rule lets hold.
	for queue, want := range map[string]int{"": 0, "x": 1, "xs": 1, "ssxs": 2, "222": 2, "2222": 2, "2x2": 1, "sx": 1} {
		if got := len(holders("job", mk(queue))); got != want {
			t.Errorf("holders of %q: %d; want %d", queue, got, want)
		}
	}
	// The error names the recorded N.
	_, _, err := judge("job", mk("23"), 1)
	if err == nil || err.Error() != `"job" is a semaphore of 2 (--max-holders 2); this holder asked for 3` {
		t.Errorf("mismatched N: %v", err)
	}
}

// handedOff lets a waiter hold on the deletion of the one key ahead of it,
// without a read, only while its lease's last renewal is recent: a waiter
// stopped or suspended past that reads, since its lease may have run out.
func TestHandedOff(t *testing.T) {
	b := &backend{opts: lock.Options{TTL: 600 * time.Millisecond}}
	q := []entry{{key: "job/1", rev: 1}, {key: "job/2", rev: 2}, {key: "job/3", rev: 3}}
	l := &lease{b: b, name: "job", key: "job/2", renewal: lock.Read()}
	if rest, ok := l.handedOff(q, 1, 0); !ok || len(rest) != 2 || rest[0].key != "job/2" {
		t.Errorf("the one key ahead gone: %v, %v; want to hold, with the queue from our key on", rest, ok)
	}
	if _, ok := l.handedOff(append([]entry{{key: "job/0", rev: 0}}, q...), 2, 1); ok {
		t.Error("holds with another key still ahead; want a read")
	}
	if len(q) != 3 || q[0].key != "job/1" {
		t.Errorf("handedOff changed the queue it was given: %v", q)
	}
	// The renewal ages past KeepInterval, as in a process stopped that long.
	time.Sleep(b.opts.KeepInterval())
	if _, ok := l.handedOff(q, 1, 0); ok {
		t.Error("holds, its renewal a KeepInterval old; want a read")
	}
}

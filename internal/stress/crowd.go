package stress

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Crowd is many waiters at once: a holder takes the stress NAME
// on a server of b started for t, then n withlocks start at once, each to
// run the section once; when every one of them has said that it waits
// (withlock -v), the holder lets go. No faults: the server is reached
// directly. It fails t if a waiter does not finish within cfg.Drain of the
// holder's release (a lost or starved waiter); the report says whether the
// sections ran one at a time.
func Crowd(t testing.TB, bin Binaries, b Backend, n int, cfg Config) Report {
	t.Helper()
	dbURL, env, _ := b.start(t, nil)
	dir := t.TempDir()
	held, release := filepath.Join(dir, "held"), filepath.Join(dir, "release")
	holder := exec.Command(bin.Withlock, "--ttl", cfg.TTL.String(), "--kill-after", cfg.KillAfter.String(),
		"--db", dbURL, lockName, "--", "sh", "-c",
		fmt.Sprintf("echo x > %s; while [ ! -e %s ]; do sleep 0.05; done", held, release))
	holder.Env = append(environ(), env...)
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	letGo := sync.OnceFunc(func() { os.WriteFile(release, nil, 0o644) })
	defer func() {
		letGo()
		holder.Wait()
	}()
	for {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if holder.ProcessState != nil {
			t.Fatal("stress: the holder exited before it held the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}

	waiting := make(chan struct{}, n)
	h := &harness{bin: bin, cfg: cfg, url: dbURL, env: env, dir: t.TempDir(), waiting: func() {
		select {
		case waiting <- struct{}{}:
		default: // said twice: counted once is enough
		}
	}}
	kill, killNow := context.WithCancel(context.Background())
	defer killNow()
	start := time.Now()
	var (
		mu    sync.Mutex
		runs  []Run
		wg    sync.WaitGroup
		ended atomic.Int64
	)
	for c := range n {
		wg.Go(func() {
			defer ended.Add(1)
			r, err := h.run(kill, c, 0)
			if err != nil {
				t.Errorf("stress: waiter %d: %v", c, err)
				return
			}
			mu.Lock()
			runs = append(runs, r)
			mu.Unlock()
		})
	}
	// Every waiter waits before the holder lets go; one that cannot even
	// start (a server out of connections) ends instead, and is reported.
	for w := 0; w < n; {
		select {
		case <-waiting:
			w++
			continue
		case <-time.After(time.Second):
		}
		if e := ended.Load(); e > 0 {
			t.Errorf("stress: %s: %d of %d waiters ended while the holder still held the lock", b.Name, e, n)
			break
		}
		if time.Since(start) > cfg.Drain {
			t.Errorf("stress: %s: %d of %d waiters said they wait after %v", b.Name, w, n, cfg.Drain)
			break
		}
	}
	t.Logf("%s: %d waiters waiting after %v", b.Name, n, time.Since(start).Round(100*time.Millisecond))
	letGo()
	released := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.Drain):
		t.Errorf("stress: %s: waiters still under way %v after the holder let go; killing them", b.Name, cfg.Drain)
		killNow()
		<-done
	}
	rep := Check(b.Name, runs, b.Tokens)
	rep.Took = time.Since(released)
	return rep
}

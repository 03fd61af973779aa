// Package stress is withlock's stress test: contenders run the real
// withlock binary in a loop on one lock NAME, against a real server behind a
// fault proxy that cuts connections and black-holes the network at random;
// each command records when it entered and left its critical section and with
// which fencing token, and Check verifies that no two ever ran at once.
//
// TestStress runs it: a few seconds per backend in `make test`, and at least
// 1,000 runs per backend in `make stress`. A backend is one entry of
// Backends; a fault is one Fault of an Injector.
package stress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

// Binaries are the programs a stress run executes.
type Binaries struct {
	Withlock string // the real withlock, built as `make build` builds it
	Section  string // the critical section, internal/stress/section
}

// Build builds withlock and the critical section into dir (with the go
// command's cache, seconds).
func Build(dir string) (Binaries, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("stress: the go command is needed to build withlock: %w", err)
	}
	build := exec.Command(goCmd, "build", "-trimpath", "-o", dir+string(filepath.Separator),
		"github.com/withlock/withlock", "github.com/withlock/withlock/internal/stress/section")
	// A static binary, as `make build` makes it.
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("stress: go build: %w\n%s", err, out)
	}
	return Binaries{Withlock: filepath.Join(dir, "withlock"), Section: filepath.Join(dir, "section")}, nil
}

// Config says how hard to stress one backend.
type Config struct {
	Contenders int           // withlock loops running at once
	Hold       time.Duration // how long each section holds the lock
	// The flags of every withlock.
	TTL, KillAfter, ConnectTimeout time.Duration
	// New runs stop after Runs runs or after For, whichever comes first
	// (zero: no limit; one of them must be set). The runs under way then
	// finish, with the faults stopped.
	Runs int
	For  time.Duration
	// Drain bounds how long the runs under way may take to finish once new
	// runs stopped; those still running then are killed and reported.
	Drain time.Duration
	// Faults returns the injector for a network backend, given what it can
	// act on; nil injects nothing.
	Faults func(tg Targets) Injector
	// Mode is how every withlock takes the lock.
	Mode Mode
	Seed uint64
	// Progress, if set, logs the number of runs so far this often.
	Progress time.Duration
	// Unlocked gives each contender a NAME of its own, so that nothing
	// excludes anything: for the harness's own test, which must then see
	// overlaps.
	Unlocked bool
}

// Mode is how the contenders take the lock.
type Mode struct {
	// MaxHolders > 1 makes every withlock take a semaphore of that many
	// places (--max-holders).
	MaxHolders int
	// Mixed takes two runs in three --shared and the third exclusive.
	Mixed bool
}

// String names m for the report.
func (m Mode) String() string {
	switch {
	case m.MaxHolders > 1:
		return fmt.Sprintf("semaphore %d", m.MaxHolders)
	case m.Mixed:
		return "shared+excl"
	}
	return "exclusive"
}

// Targets are what an injector can act on for one backend.
type Targets struct {
	Proxy   *faultproxy.Proxy
	Server  Server  // nil if the backend gives none
	Holders Holders // the run's withlocks
	TTL     time.Duration
	// Fail reports a fault that could not be injected or ended (a server
	// that did not start again).
	Fail func(error)
}

// Recipe is the network faults' recipe for a proxy: every 0.5–2.5s at random,
// either cut every connection or black-hole the network for 1–4s.
func Recipe(tg Targets) Injector {
	return Injector{
		MinPause: 500 * time.Millisecond,
		MaxPause: 2500 * time.Millisecond,
		Faults:   []Fault{Cut(tg.Proxy), BlackHole(tg.Proxy, time.Second, 4*time.Second)},
	}
}

// AllFaults is every fault: Recipe's cuts and black-holes, and, as
// often each, a restart of the server (down for 0.2–1s), a freeze of the
// server for ttl + 0.5–2s, a freeze of a holder's withlock for as long
// (its command runs on), and a freeze of a holder's withlock and command
// together (a host paused): longer than the ttl, so that the lock is lost
// and taken over.
func AllFaults(tg Targets) Injector {
	in := Recipe(tg)
	long := func() (time.Duration, time.Duration) { return tg.TTL + 500*time.Millisecond, tg.TTL + 2*time.Second }
	if tg.Server != nil {
		in.Faults = append(in.Faults, Restart(tg.Server, 200*time.Millisecond, time.Second, tg.Fail))
		lo, hi := long()
		in.Faults = append(in.Faults, FreezeServer(tg.Server, lo, hi))
	}
	lo, hi := long()
	in.Faults = append(in.Faults, FreezeHolder(tg.Holders, false, lo, hi), FreezeHolder(tg.Holders, true, lo, hi))
	return in
}

// lockName is the one NAME every contender takes.
const lockName = "stress"

// Stress runs cfg against a server of b started for t and returns the
// runs, checked. It fails t if the harness cannot run withlock, or if runs
// are still under way cfg.Drain after the last one started (a lost waiter);
// what the report finds is the caller's to judge. The injector's random
// choices follow cfg.Seed and the backend's name: each backend sees its own
// sequence of pauses and faults, the same again with the same seed.
func Stress(t testing.TB, bin Binaries, b Backend, cfg Config) Report {
	t.Helper()
	if cfg.Runs <= 0 && cfg.For <= 0 {
		t.Fatal("stress: Config needs Runs or For")
	}
	h := &harness{bin: bin, cfg: cfg, dir: t.TempDir(), live: map[int]*liveRun{}}
	var proxy func(target string) string
	var p *faultproxy.Proxy
	if b.Network {
		proxy = func(target string) string {
			var err error
			if p, err = faultproxy.Start(target); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p.Addr()
		}
	}
	var srv Server
	h.url, h.env, srv = b.start(t, proxy)
	var faults Injector
	if p != nil && cfg.Faults != nil {
		faults = cfg.Faults(Targets{Proxy: p, Server: srv, Holders: h, TTL: cfg.TTL,
			Fail: func(err error) { t.Errorf("stress: %s: injecting a fault: %v", b.Name, err) }})
	}

	stop := make(chan struct{}) // closed when no new run may start
	var stopOnce sync.Once
	stopRuns := func() { stopOnce.Do(func() { close(stop) }) }
	if cfg.For > 0 {
		timer := time.AfterFunc(cfg.For, stopRuns)
		defer timer.Stop()
	}
	// kill ends the runs still under way when the drain is over.
	kill, killNow := context.WithCancel(context.Background())
	defer killNow()

	injectCtx, stopInjecting := context.WithCancel(context.Background())
	injected := make(chan map[string]int, 1)
	go func() {
		name := fnv.New64a()
		name.Write([]byte(b.Name + " " + cfg.Mode.String()))
		injected <- faults.Run(injectCtx, rand.New(rand.NewPCG(cfg.Seed, name.Sum64())))
	}()

	start := time.Now()
	var (
		started atomic.Int64
		mu      sync.Mutex
		runs    []Run
		wg      sync.WaitGroup
	)
	for c := range cfg.Contenders {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				if n := started.Add(1); cfg.Runs > 0 && n > int64(cfg.Runs) {
					stopRuns()
					return
				}
				r, err := h.run(kill, c, seq)
				if err != nil {
					t.Errorf("stress: contender %d: %v", c, err)
					stopRuns()
					return
				}
				mu.Lock()
				runs = append(runs, r)
				mu.Unlock()
			}
		})
	}
	if cfg.Progress > 0 {
		tick := time.NewTicker(cfg.Progress)
		defer tick.Stop()
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					mu.Lock()
					n := len(runs)
					mu.Unlock()
					t.Logf("%s: %d runs in %v", b.Name, n, time.Since(start).Round(time.Second))
				}
			}
		}()
	}
	<-stop
	// Faults end with new runs, so that the last ones can finish.
	stopInjecting()
	counts := <-injected
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain := time.NewTimer(cfg.Drain)
	select {
	case <-done:
		drain.Stop()
	case <-drain.C:
		t.Errorf("stress: %s: runs still under way %v after the last one started and the faults stopped; killing them (a waiter lost?)", b.Name, cfg.Drain)
		killNow()
		<-done
	}
	rules := Rules{Tokens: b.Tokens, MaxHolders: max(1, cfg.Mode.MaxHolders), FrozenGrace: cfg.KillAfter}
	rep := CheckRules(b.Name, runs, rules)
	rep.Mode = cfg.Mode.String()
	rep.Faults = counts
	rep.Took = time.Since(start)
	return rep
}

// harness runs one backend's withlocks.
type harness struct {
	bin Binaries
	cfg Config
	url string
	env []string // withlock's environment besides the test's (KUBECONFIG)
	dir string   // the sections' record files
	// waiting, if set, runs withlock with -v and is called once for each
	// run whose withlock says that it waits (Crowd).
	waiting func()

	mu   sync.Mutex
	live map[int]*liveRun // by pid: the withlocks running now (Stress)
}

// liveRun is a withlock running now, for FreezeHolder.
type liveRun struct {
	proc                 *os.Process
	out                  string // its section's record file
	frozenFrom, frozenTo int64
	groups               []int // the process groups of its command, if frozen too
}

// Holding lists the withlocks whose section has entered and not ended, and
// that were never frozen.
func (h *harness) Holding() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pids []int
	for pid, l := range h.live {
		if l.frozenFrom != 0 {
			continue
		}
		b, _ := os.ReadFile(l.out)
		if strings.HasPrefix(string(b), "enter ") && strings.Count(string(b), "\n") == 1 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Freeze stops pid's withlock, and with command its section's process
// group (withlock starts its command in a group of its own).
func (h *harness) Freeze(pid int, command bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.live[pid]
	// os.Process.Signal never reaches another process that reused the
	// pid: it fails once the run's withlock has been waited for.
	if !ok || l.proc.Signal(syscall.SIGSTOP) != nil {
		return false
	}
	if command {
		// The withlock is stopped and its child not yet reaped, so the
		// child's pid (and group) is still its own.
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				syscall.Kill(-c, syscall.SIGSTOP)
				l.groups = append(l.groups, c)
			}
		}
	}
	l.frozenFrom = now()
	return true
}

// Thaw lets pid's withlock, and its command if frozen, go on.
func (h *harness) Thaw(pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.live[pid]
	if !ok {
		return
	}
	for _, g := range l.groups {
		syscall.Kill(-g, syscall.SIGCONT)
	}
	l.proc.Signal(syscall.SIGCONT)
	l.frozenTo = now()
}

// run runs one withlock with the section as its command and returns what
// happened. An error means the harness could not run it at all.
func (h *harness) run(kill context.Context, contender, seq int) (Run, error) {
	out := filepath.Join(h.dir, fmt.Sprintf("c%02d-%d", contender, seq))
	name := lockName
	if h.cfg.Unlocked {
		name = fmt.Sprintf("%s-%d", lockName, contender)
	}
	var flags []string
	if h.waiting != nil {
		flags = []string{"-v"}
	}
	shared := h.cfg.Mode.Mixed && (contender+seq)%3 != 0
	switch {
	case h.cfg.Mode.MaxHolders > 1:
		flags = append(flags, "--max-holders", strconv.Itoa(h.cfg.Mode.MaxHolders))
	case shared:
		flags = append(flags, "--shared")
	}
	cmd := exec.CommandContext(kill, h.bin.Withlock, append(flags,
		"--ttl", h.cfg.TTL.String(),
		"--kill-after", h.cfg.KillAfter.String(),
		"--connect-timeout", h.cfg.ConnectTimeout.String(),
		"--db", h.url,
		name, "--", h.bin.Section)...)
	cmd.Env = append(append(environ(), h.env...),
		"WITHLOCK_STRESS_OUT="+out,
		"WITHLOCK_STRESS_HOLD="+h.cfg.Hold.String())
	// Stderr is a pipe of our own, not a writer, so that Wait returns when
	// withlock exits rather than when its output is copied.
	pr, pw, err := os.Pipe()
	if err != nil {
		return Run{}, err
	}
	cmd.Stderr = pw
	r := Run{Contender: contender, Started: now(), Shared: shared}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return Run{}, err
	}
	if h.live != nil {
		h.mu.Lock()
		h.live[cmd.Process.Pid] = &liveRun{proc: cmd.Process, out: out}
		h.mu.Unlock()
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		var tail []string // the last lines: one message of withlock's may take several
		s := bufio.NewScanner(pr)
		for s.Scan() {
			line := s.Text()
			if r.LostAt == 0 && strings.Contains(line, "lost the lock") {
				r.LostAt = now()
			}
			if h.waiting != nil && strings.Contains(line, "held; waiting") {
				h.waiting()
			}
			tail = append(tail, strings.TrimSpace(line))
			if len(tail) > 3 {
				tail = tail[1:]
			}
		}
		r.Stderr = strings.Join(tail, " ⏎ ")
	}()
	err = cmd.Wait()
	r.Exited = now()
	if h.live != nil {
		h.mu.Lock()
		if l := h.live[cmd.Process.Pid]; l != nil {
			r.FrozenFrom, r.FrozenTo = l.frozenFrom, l.frozenTo
		}
		delete(h.live, cmd.Process.Pid)
		h.mu.Unlock()
	}
	// The section holds the pipe too: EOF means it is gone as well, and its
	// record complete.
	<-scanned
	pr.Close()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return Run{}, err
	}
	r.Status = cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		r.Status = 128 + int(ws.Signal())
	}
	if err := readSection(out, &r); err != nil {
		return Run{}, err
	}
	os.Remove(out)
	return r, nil
}

// readSection reads the record file of a section (see internal/stress/section)
// into r. No file, or an empty one (killed before it wrote), means the
// section never entered.
func readSection(name string, r *Run) error {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		var token string
		switch {
		case strings.HasPrefix(line, "enter "):
			if _, err := fmt.Sscanf(line, "enter %d %s", &r.Enter, &token); err != nil {
				return fmt.Errorf("%s: %q: %v", name, line, err)
			}
			r.Entered = true
			if token != "-" {
				r.Token = token
			}
		case strings.HasPrefix(line, "exit "), strings.HasPrefix(line, "stopped "):
			var what string
			if _, err := fmt.Sscanf(line, "%s %d", &what, &r.End); err != nil {
				return fmt.Errorf("%s: %q: %v", name, line, err)
			}
			r.Ended, r.Stopped = true, what == "stopped"
		default:
			return fmt.Errorf("%s: unexpected line %q", name, line)
		}
	}
	return nil
}

// environ is the test's environment without any backend or lock setting
// that would reach withlock or its command from outside.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "WITHLOCK_") || strings.HasPrefix(kv, "PG_CONNECTION_STRING=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// now is CLOCK_MONOTONIC in nanoseconds, the clock the sections record.
func now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

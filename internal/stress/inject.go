package stress

import (
	"context"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

// Fault is one kind of fault an Injector injects.
type Fault struct {
	Name string // how the report counts it: "cuts", "black-holes"
	// Inject injects the fault and returns once it is over: at once for a
	// cut, after its duration for a black-hole. It must end the fault (heal
	// the network, resume the server) before it returns, also when ctx ends.
	// It returns whether it injected the fault (a holder to freeze may not
	// be found).
	Inject func(ctx context.Context, rng *rand.Rand) bool
}

// Injector injects faults at random: it pauses for a random time between
// MinPause and MaxPause, then injects one of Faults chosen with equal
// chances, and again, until its context ends.
type Injector struct {
	MinPause, MaxPause time.Duration
	Faults             []Fault
}

// Run injects faults until ctx ends and returns how many of each kind it
// injected. No fault is in force when it returns.
func (in Injector) Run(ctx context.Context, rng *rand.Rand) map[string]int {
	counts := map[string]int{}
	if len(in.Faults) == 0 {
		<-ctx.Done()
		return counts
	}
	for {
		t := time.NewTimer(uniform(rng, in.MinPause, in.MaxPause))
		select {
		case <-ctx.Done():
			t.Stop()
			return counts
		case <-t.C:
		}
		f := in.Faults[rng.IntN(len(in.Faults))]
		if f.Inject(ctx, rng) {
			counts[f.Name]++
		}
	}
}

// Cut resets every connection through p.
func Cut(p *faultproxy.Proxy) Fault {
	return Fault{Name: "cuts", Inject: func(context.Context, *rand.Rand) bool { p.Cut(); return true }}
}

// BlackHole black-holes p for a random time between min and max: a
// partition, during which connections stay open and nothing arrives.
func BlackHole(p *faultproxy.Proxy, min, max time.Duration) Fault {
	return Fault{Name: "black-holes", Inject: func(ctx context.Context, rng *rand.Rand) bool {
		p.BlackHole()
		defer p.Heal()
		sleep(ctx, uniform(rng, min, max))
		return true
	}}
}

// uniform is a random duration in [lo, hi].
func uniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// Server is a test server the injector can restart and freeze: testenv's
// servers, whose Stop and Start keep the port and the data.
type Server interface {
	Stop() error
	Start() error
	// PID is the server's process id, 0 while it is stopped. It leads a
	// process group of its own (testenv starts it so), which holds every
	// process of the server: PostgreSQL's sessions too.
	PID() int
}

// Restart stops srv and starts it again after a random time between min and
// max: every session and connection ends, and a server that keeps nothing
// in memory (Redis without persistence) forgets its leases.
func Restart(srv Server, min, max time.Duration, fail func(error)) Fault {
	return Fault{Name: "restarts", Inject: func(ctx context.Context, rng *rand.Rand) bool {
		if err := srv.Stop(); err != nil {
			fail(err)
			return false
		}
		sleep(ctx, uniform(rng, min, max))
		if err := srv.Start(); err != nil {
			fail(err)
		}
		return true
	}}
}

// FreezeServer freezes every process of srv (SIGSTOP to its process
// group) for a random time between min and max: connections stay open,
// nothing is answered, and the server's clocks go on.
func FreezeServer(srv Server, min, max time.Duration) Fault {
	return Fault{Name: "server freezes", Inject: func(ctx context.Context, rng *rand.Rand) bool {
		pid := srv.PID()
		if pid == 0 || syscall.Kill(-pid, syscall.SIGSTOP) != nil {
			return false
		}
		defer syscall.Kill(-pid, syscall.SIGCONT)
		sleep(ctx, uniform(rng, min, max))
		return true
	}}
}

// FreezeHolder freezes the withlock of a run whose section is running
// (SIGSTOP to withlock alone: its command runs on, as a command in another
// process or on another machine than a paused withlock would) for a random
// time between min and max, then lets it go on. holders lists the runs
// whose section is running; freeze and thaw record when it was stopped and
// let go on.
//
// With command, its command is frozen too (SIGSTOP to its process group), as
// when the host is paused or asleep: when both go on, the command runs on
// for a moment alongside the new holder, until withlock stops it.
func FreezeHolder(h Holders, command bool, min, max time.Duration) Fault {
	name := "holder freezes"
	if command {
		name = "host freezes"
	}
	return Fault{Name: name, Inject: func(ctx context.Context, rng *rand.Rand) bool {
		// The lock is busy most of the time; wait a little for a holder
		// rather than skip the fault.
		var pid int
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if pids := h.Holding(); len(pids) > 0 {
				pid = pids[rng.IntN(len(pids))]
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return false
			}
		}
		if !h.Freeze(pid, command) {
			return false
		}
		defer h.Thaw(pid)
		sleep(ctx, uniform(rng, min, max))
		return true
	}}
}

// Holders are the withlocks of a stress run that FreezeHolder can freeze.
type Holders interface {
	// Holding lists the pids of the withlocks whose section has entered
	// and not yet ended, and that were not frozen before.
	Holding() []int
	// Freeze stops pid's withlock (SIGSTOP), with command its command's
	// process group too, and records when; false if it is gone.
	Freeze(pid int, command bool) bool
	// Thaw lets them go on (SIGCONT) and records when.
	Thaw(pid int)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

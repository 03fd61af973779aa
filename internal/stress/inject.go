package stress

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

// Fault is one kind of fault an Injector injects.
type Fault struct {
	Name string // how the report counts it: "cuts", "black-holes"
	// Inject injects the fault and returns once it is over: at once for a
	// cut, after its duration for a black-hole. It must end the fault (heal
	// the network, resume the server) before it returns, also when ctx ends.
	Inject func(ctx context.Context, rng *rand.Rand)
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
		counts[f.Name]++
		f.Inject(ctx, rng)
	}
}

// Cut resets every connection through p (issue 15's "cuts all connections").
func Cut(p *faultproxy.Proxy) Fault {
	return Fault{Name: "cuts", Inject: func(context.Context, *rand.Rand) { p.Cut() }}
}

// BlackHole black-holes p for a random time between min and max: a
// partition, during which connections stay open and nothing arrives.
func BlackHole(p *faultproxy.Proxy, min, max time.Duration) Fault {
	return Fault{Name: "black-holes", Inject: func(ctx context.Context, rng *rand.Rand) {
		p.BlackHole()
		defer p.Heal()
		t := time.NewTimer(uniform(rng, min, max))
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}}
}

// uniform is a random duration in [lo, hi].
func uniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

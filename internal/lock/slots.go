package lock

import (
	"errors"
	"time"
)

// A semaphore of N on a backend without one is N slots, each a lock of
// its own (a Kubernetes Lease, an S3 object): a holder takes the first
// free one. FirstFreeSlot is that loop; SlotHeld is what one slot's attempt
// returns when that slot is held and the next is worth trying.

// errNextSlot marks a SlotHeld error.
var errNextSlot = errors.New("lock: slot held")

// SlotHeld is the ErrHeld of one slot, after which the next slot is worth
// trying; left, when known (zero or more), is how long the slot's holder
// has left (Remaining).
func SlotHeld(left time.Duration) error {
	if left < 0 {
		return slotHeld{}
	}
	return slotHeldFor{left}
}

type slotHeld struct{}

func (slotHeld) Error() string   { return ErrHeld.Error() }
func (slotHeld) Unwrap() []error { return []error{ErrHeld, errNextSlot} }

type slotHeldFor struct{ left time.Duration }

func (e slotHeldFor) Error() string            { return ErrHeld.Error() }
func (e slotHeldFor) Unwrap() []error          { return []error{ErrHeld, errNextSlot} }
func (e slotHeldFor) Remaining() time.Duration { return e.left }

// FirstFreeSlot tries slots 0 to n-1 in turn with try, and returns the
// first Lease taken. A slot whose attempt fails with SlotHeld makes it try
// the next; any other error ends the attempt. When every slot is held, the
// error is ErrHeld, with the soonest time left of any slot that said.
func FirstFreeSlot(n int, try func(slot int) (Lease, error)) (Lease, error) {
	var soonest time.Duration = -1
	for i := range n {
		l, err := try(i)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, errNextSlot) {
			return nil, err
		}
		if left, ok := Remaining(err); ok && (soonest < 0 || left < soonest) {
			soonest = left
		}
	}
	if soonest >= 0 {
		return nil, HeldFor(soonest)
	}
	return nil, ErrHeld
}

package lock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// Client is a Backend opened with one Options value: Acquire's wait loop,
// the keep loop of the Held it returns, and the backend itself (its lease
// length, its mode) all read that value. Its Backend's single attempts
// (TryAcquire) and Close are the Client's own.
type Client struct {
	Backend
	opts Options
}

// NewClient wraps an already opened Backend; Open is the usual way. opts
// must be those the Backend was opened with; zero values mean the defaults.
func NewClient(b Backend, opts Options) *Client {
	return &Client{Backend: b, opts: opts.withDefaults()}
}

// Options are the Client's options, with their defaults filled in.
func (c *Client) Options() Options { return c.opts }

// Inspect returns name's state (withlock status), its holders oldest first.
func (c *Client) Inspect(ctx context.Context, name string) (State, error) {
	if err := CheckName(name); err != nil {
		return State{}, err
	}
	st, err := c.Backend.Inspect(ctx, name)
	if err != nil {
		return State{}, fmt.Errorf("status %q: %w", name, err)
	}
	slices.SortStableFunc(st.Holders, oldestFirst)
	return st, nil
}

// List returns every lock held right now (withlock status without NAME):
// withlock's locks by name, then other tools' locks by key; the holders of
// each oldest first.
func (c *Client) List(ctx context.Context) ([]State, error) {
	states, err := c.Backend.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, st := range states {
		slices.SortStableFunc(st.Holders, oldestFirst)
	}
	slices.SortStableFunc(states, func(a, b State) int {
		return cmp.Or(cmp.Compare(b2i(a.Name == ""), b2i(b.Name == "")), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Key, b.Key))
	})
	return states, nil
}

// Break breaks name's lock, whoever holds it (withlock release --force),
// and returns whom it broke, oldest first.
func (c *Client) Break(ctx context.Context, name string) ([]Holder, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	broken, err := c.Backend.Break(ctx, name)
	slices.SortStableFunc(broken, oldestFirst)
	if err != nil {
		return broken, fmt.Errorf("release %q: %w", name, err)
	}
	return broken, nil
}

// Detach stops keeping h, a lock this Client took, without releasing it:
// its lease runs out at until unless renewed. It returns the ticket with
// which Resume takes the lease up again. A backend whose locks are held by
// a session fails with ErrUsage.
func (c *Client) Detach(ctx context.Context, h *Held, until time.Time) (string, error) {
	d, ok := c.Backend.(Detachable)
	if !ok {
		return "", Errorf(ErrUsage, "this backend holds a lock in a session, which cannot outlive the process that took it")
	}
	if err := h.Detach(ctx, until); err != nil {
		return "", err
	}
	return d.Ticket(h.lease), nil
}

// Ticket is the ticket of h's lease, a lock this Client took and still
// keeps, as Detach would give it: with it, another process can release
// the lease through the backend (Resume). False for a session backend.
func (c *Client) Ticket(h *Held) (string, bool) {
	d, ok := c.Backend.(Detachable)
	if !ok {
		return "", false
	}
	return d.Ticket(h.lease), true
}

// Resume takes up again the lease of name that ticket (from Detach) names,
// as Detachable.Resume says.
func (c *Client) Resume(ctx context.Context, name, ticket string) (Expiring, Lease, error) {
	d, ok := c.Backend.(Detachable)
	if !ok {
		return nil, nil, Errorf(ErrUsage, "this backend holds a lock in a session: it has no leases to take up again")
	}
	l, err := d.Resume(ctx, name, ticket)
	if err != nil {
		return nil, nil, err
	}
	e, ok := l.(Expiring)
	if !ok {
		return nil, nil, fmt.Errorf("the backend resumed a lease that does not expire")
	}
	return e, l, nil
}

// Detachable reports whether the backend's leases can outlive the
// process that took them (Detach).
func (c *Client) Detachable() bool {
	_, ok := c.Backend.(Detachable)
	return ok
}

// oldestFirst orders holders by when they took the lock (unknown last),
// then by fencing token.
func oldestFirst(a, b Holder) int {
	return cmp.Or(cmp.Compare(b2i(a.AcquiredAt.IsZero()), b2i(b.AcquiredAt.IsZero())), a.AcquiredAt.Compare(b.AcquiredAt), cmp.Compare(a.Token, b.Token))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

package lock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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

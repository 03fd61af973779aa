package lock

import (
	"context"
	"fmt"
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

// Inspect returns name's state (withlock status). The error wraps
// ErrNotSupported if the backend cannot tell.
func (c *Client) Inspect(ctx context.Context, name string) (State, error) {
	if err := CheckName(name); err != nil {
		return State{}, err
	}
	in, ok := c.Backend.(Inspector)
	if !ok {
		return State{}, Errorf(ErrNotSupported, "this backend cannot show who holds a lock yet")
	}
	st, err := in.Inspect(ctx, name)
	if err != nil {
		return State{}, fmt.Errorf("status %q: %w", name, err)
	}
	return st, nil
}

// List returns every lock held right now (withlock status without NAME).
func (c *Client) List(ctx context.Context) ([]State, error) {
	in, ok := c.Backend.(Inspector)
	if !ok {
		return nil, Errorf(ErrNotSupported, "this backend cannot list its locks yet")
	}
	return in.List(ctx)
}

// Break breaks name's lock, whoever holds it (withlock release --force),
// and returns whom it broke.
func (c *Client) Break(ctx context.Context, name string) ([]Holder, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	br, ok := c.Backend.(Breaker)
	if !ok {
		return nil, Errorf(ErrNotSupported, "this backend cannot break a lock yet")
	}
	broken, err := br.Break(ctx, name)
	if err != nil {
		return broken, fmt.Errorf("release %q: %w", name, err)
	}
	return broken, nil
}

package mongodb

import (
	"context"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/withlock/withlock/internal/lock"
)

// Inspect returns name's newest state, with the holders whose lease has not
// run out by the server's clock.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	if err := b.connect(); err != nil {
		return lock.State{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	cur, _, err := b.newest(ctx, name)
	if err != nil {
		return lock.State{}, err
	}
	now, err := b.serverTime(ctx)
	if err != nil {
		return lock.State{}, err
	}
	return stateOf(name, cur, now), nil
}

// List returns every name whose newest state has a live holder. It reads
// the whole collection (on MongoDB as on FerretDB): the deletions keep it
// to a few documents per name.
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	cur, err := b.locks.Find(ctx, bson.D{})
	if err != nil {
		return nil, b.classify(ctx, err)
	}
	newest := map[string]state{}
	for cur.Next(ctx) {
		var s state
		// Documents of other shapes (the lease documents of earlier
		// versions, anyone's) are not states of a chain: skip them.
		if err := cur.Decode(&s); err != nil || s.Name == "" || !strings.HasPrefix(s.ID, s.Name+"#") {
			continue
		}
		if n, ok := newest[s.Name]; !ok || s.Seq > n.Seq {
			newest[s.Name] = s
		}
	}
	if err := cur.Err(); err != nil {
		return nil, b.classify(ctx, err)
	}
	cur.Close(ctx)
	now, err := b.serverTime(ctx)
	if err != nil {
		return nil, err
	}
	var held []lock.State
	for name, s := range newest {
		if st := stateOf(name, &s, now); len(st.Holders) > 0 {
			held = append(held, st)
		}
	}
	return held, nil
}

// stateOf is name's state s (nil: none) as status shows it at the server's
// time now: the live holders, oldest first.
func stateOf(name string, s *state, now time.Time) lock.State {
	st := lock.State{Name: name}
	live := s.live(now)
	if len(live) == 0 {
		return st
	}
	st.Mode = s.mode()
	if st.Mode == lock.Semaphore {
		st.MaxHolders = s.Max
	}
	for _, h := range live {
		st.Holders = append(st.Holders, holderOf(h))
	}
	return st
}

func holderOf(h holder) lock.Holder {
	return lock.Holder{Host: h.Host, PID: h.PID, Command: h.Command, AcquiredAt: h.AcquiredAt, ExpiresAt: h.ExpiresAt, Token: h.Token}
}

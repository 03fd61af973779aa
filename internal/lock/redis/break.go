package redis

import (
	"context"

	"github.com/withlock/withlock/internal/lock"
)

// Break deletes name's lock whatever its holders, and publishes the
// release so that waiters try at once. The fence counter stays: the next
// holder's token still grows. Each holder's next Keep finds its lease gone
// (ErrLost). A key at withlock:{NAME} that is no lease (no expiry, or not
// a string or hash) is left alone: ErrHeld.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	reply, err := breakScript.get().Run(ctx, b.client, []string{Key(name), Channel(name)}, b.publish()).Slice()
	if err != nil {
		return nil, b.classifyIn(err, breakScript, Key(name), Channel(name))
	}
	code, _ := reply[0].(int64)
	switch {
	case code == 0:
		return nil, nil
	case code == 2 && len(reply) == 2:
		kind, _ := reply[1].(string)
		return nil, lock.Errorf(lock.ErrHeld, "redis at %s: %s is a %s without an expiry, not a withlock lease; it was left alone (delete it yourself if you know whose it is)", b.addr, Key(name), kind)
	case code == 1 && len(reply) == 4:
		now, _ := reply[1].(int64)
		kind, _ := reply[2].(string)
		list, _ := reply[3].([]any)
		fields := map[string]string{}
		for i := 0; i+1 < len(list); i += 2 {
			f, _ := list[i].(string)
			v, _ := list[i+1].(string)
			fields[f] = v
		}
		return b.state(Key(name), now, kind, -1, fields).Holders, nil
	}
	return nil, b.unexpected("break", reply)
}

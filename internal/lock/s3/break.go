package s3

import (
	"context"

	"github.com/withlock/withlock/internal/lock"
)

// Break writes a free body over each of name's objects whose holder has
// not run out by the store's clock, each conditional on the ETag just
// read, so that a holder that renewed in between is not broken blind: that
// is ErrHeld, and release --force can be run again. The objects keep their
// count of acquisitions (the fencing token). Their holders find the object
// no longer theirs at their next renewal (lock.Lease's Keep) and stop.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	objs, err := b.objectsOf(ctx, name)
	if err != nil {
		return nil, err
	}
	var broken []lock.Holder
	for _, o := range objs {
		h, ok := b.holderOf(o)
		if !ok {
			continue // free, or run out: free to any attempt already
		}
		_, err := b.put(ctx, o.key, o.rec.freed(), condition{ifMatch: o.etag})
		switch {
		case failed(err):
			return broken, lock.Errorf(lock.ErrHeld, "%s: the object %s changed while it was being broken; run release --force again", b.where, o.key)
		case err != nil:
			return broken, b.classify(err, "s3:PutObject")
		}
		broken = append(broken, h)
	}
	return broken, nil
}

package k8s

import (
	"context"
	"net/http"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// Break clears the holder of each of name's Leases that has one that has
// not run out by the API server's clock (serverExpiry; without the server's
// times, every holder is broken), each conditional on the version just
// read, so that a holder that renewed in between is not broken blind: that
// is ErrHeld, and release --force can be run again. The Leases stay, with
// their count of acquisitions (the fencing token). Their holders find the
// Lease no longer theirs at their next renewal (lock.Lease's Keep) and
// stop.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	leases, err := b.leasesOf(ctx, name)
	if err != nil {
		return nil, err
	}
	var broken []lock.Holder
	for _, l := range leases {
		if l.Spec.HolderIdentity == "" {
			continue
		}
		if _, left, ok := serverExpiry(&l, b.ttl()); ok && left <= 0 {
			continue // run out: free to any attempt already
		}
		h, _ := b.holderOf(&l, time.Now())
		_, created, err := b.c.update(ctx, b.cfg.namespace, freed(&l))
		if err == nil && created {
			continue // deleted since the list: nothing to break (the copy is free)
		}
		switch {
		case isCode(err, http.StatusConflict):
			return broken, lock.Errorf(lock.ErrHeld, "the Lease %s/%s changed while it was being broken; run release --force again", b.cfg.namespace, l.Metadata.Name)
		case isCode(err, http.StatusNotFound):
			continue
		case err != nil:
			return broken, b.classify(err, "update")
		}
		broken = append(broken, h)
	}
	return broken, nil
}

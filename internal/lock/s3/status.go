package s3

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/withlock/withlock/internal/lock"
)

// Inspect returns name's holders: its object's, and a semaphore's other
// slots' (as many as the object records). It only reads. A holder whose
// lease has run out by the store's clock is none, as it is to an attempt
// to take the lock.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	objs, err := b.objectsOf(ctx, name)
	if err != nil {
		return lock.State{}, err
	}
	st := lock.State{Name: name, Key: b.bucket + "/" + b.keyOf(name, 0)}
	for _, o := range objs {
		b.addHolder(&st, o)
	}
	return st, nil
}

// objectsOf reads name's objects: its own, and the other slots of the
// semaphore it records.
func (b *backend) objectsOf(ctx context.Context, name string) ([]*object, error) {
	first, err := b.get(ctx, b.keyOf(name, 0))
	if err != nil || !first.exists || first.rec.n() == 1 {
		return []*object{first}, err
	}
	rest, err := b.read(ctx, name, first.rec.n())
	if err != nil {
		return nil, err
	}
	return append([]*object{first}, rest[1:]...), nil
}

// List returns every withlock lock held under the prefix: its objects,
// each read, grouped by the name they record.
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	c, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]*lock.State{}
	var order []string
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: aws.String(b.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, b.classify(err, "s3:ListBucket")
		}
		for _, item := range page.Contents {
			o, err := b.get(ctx, aws.ToString(item.Key))
			if err != nil || !o.exists || o.rec.Name == "" {
				continue // another object in the prefix, or gone since
			}
			st := byName[o.rec.Name]
			if st == nil {
				st = &lock.State{Name: o.rec.Name, Key: b.bucket + "/" + b.keyOf(o.rec.Name, 0)}
				byName[o.rec.Name] = st
				order = append(order, o.rec.Name)
			}
			b.addHolder(st, o)
		}
	}
	var out []lock.State
	for _, name := range order {
		if st := byName[name]; len(st.Holders) > 0 {
			out = append(out, *st)
		}
	}
	return out, nil
}

// addHolder adds o's holder to st, if it has one whose lease has not run
// out.
func (b *backend) addHolder(st *lock.State, o *object) {
	h, ok := b.holderOf(o)
	if !ok {
		return
	}
	st.Holders = append(st.Holders, h)
	if n := o.rec.n(); n > 1 {
		st.Mode, st.MaxHolders = lock.Semaphore, n
	} else if st.Mode == "" {
		st.Mode = lock.Exclusive
	}
}

// holderOf reads o's holder, unless it has none or it has run out.
// ExpiresAt is by the store's clock; where the store gave no Date, the
// lease is judged by this host's clock against Last-Modified.
func (b *backend) holderOf(o *object) (lock.Holder, bool) {
	if !o.exists || o.rec.State != held {
		return lock.Holder{}, false
	}
	h := lock.Holder{Host: o.rec.Host, PID: o.rec.PID, Command: o.rec.Command, AcquiredAt: o.rec.AcquiredAt, Token: o.rec.Token}
	if at, left, ok := o.expiry(); ok {
		h.ExpiresAt = at
		return h, left > 0
	}
	h.ExpiresAt = o.modified.Add(o.rec.ttl() + expiryMargin)
	return h, h.ExpiresAt.After(time.Now())
}

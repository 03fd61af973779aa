package mongodb

import (
	"context"
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/withlock/withlock/internal/lock"
)

// Findings removes the probe lock's records, and reports whether a failover
// could undo a lease (withlock check):
// the deployment (a replica set, a sharded cluster, a standalone server)
// and the write concern the URL chose. withlock writes with w: majority
// unless the URL says otherwise; a lease that only some members have can be
// rolled back when the primary fails over, and the next holder then runs
// beside the first.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	// The probe's records: a name of its own, which nobody else writes.
	if _, err := b.locks.DeleteMany(ctx, bson.D{{Key: "name", Value: probe}}); err != nil {
		return nil, b.classify(ctx, err)
	}
	var hello struct {
		SetName string   `bson:"setName"`
		Msg     string   `bson:"msg"`
		Hosts   []string `bson:"hosts"`
	}
	if err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return nil, b.classify(ctx, err)
	}
	return []lock.Finding{writeConcernFinding(b.addr, b.w, hello.SetName, hello.Msg == "isdbgrid", len(hello.Hosts))}, nil
}

// writeConcernFinding judges the write concern w ("" for withlock's
// default, majority) on a deployment: a replica set named set of members
// data-bearing members, a sharded cluster (mongos), or else a standalone
// server.
func writeConcernFinding(addr, w, set string, mongos bool, members int) lock.Finding {
	shown := w
	if w == "" {
		shown = "majority (withlock's default)"
	}
	switch {
	case set == "" && !mongos:
		return lock.Finding{Name: "write concern", Status: lock.Warn,
			Detail: fmt.Sprintf("mongodb at %s is a standalone server: no failover can roll a lease back, but every lock is down while it is, and a restore from an old backup forgets held locks", addr),
			Fix:    "run a replica set for a lock that outlives one server"}
	case w == "" || w == "majority":
		return lock.Finding{Name: "write concern", Status: lock.Ok,
			Detail: fmt.Sprintf("leases are written with w: %s, so a failover keeps them", shown)}
	}
	if n, err := strconv.Atoi(w); err == nil && members > 0 && n > members/2 {
		return lock.Finding{Name: "write concern", Status: lock.Ok,
			Detail: fmt.Sprintf("leases are written with w: %d, a majority of the replica set's %d members, so a failover keeps them", n, members)}
	}
	return lock.Finding{Name: "write concern", Status: lock.Warn,
		Detail: fmt.Sprintf("leases are written with w: %s, below a majority: a failover can roll back a lease whose holder still runs, and the next holder runs beside it", shown),
		Fix:    "drop w from the URL (withlock writes with w: majority), or set w=majority"}
}

package mongodb_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestCheck: withlock check takes and releases its probe lock, says that
// a standalone server has no failover (FerretDB answers as one), and
// leaves no document behind.
func TestCheck(t *testing.T) {
	m := testenv.RequireMongo(t)
	c := locktest.Open(t, m.URL, lock.Options{})
	findings, err := c.Check(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 2 || findings[0].Status != lock.Ok || findings[1].Name != "write concern" || findings[1].Status != lock.Warn {
		t.Errorf("%+v; want the probe lock ok and a warning on the write concern", findings)
	}
	n, err := locks(t, m.URL).CountDocuments(locktest.Context(t), bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^" + lock.ProbePrefix}}}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d documents of the probe lock left behind", n)
	}
}

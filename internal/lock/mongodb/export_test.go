package mongodb

import (
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// SetKeep changes how far below the newest document c keeps a name's
// documents (see keep).
func SetKeep(c *lock.Client, k int64) { c.Backend.(*backend).keep = k }

// SetSpare changes how long c keeps documents after a later state was
// written (see spare): 0 deletes them as soon as keep allows, and makes
// every poll read the newest state.
func SetSpare(c *lock.Client, d time.Duration) { c.Backend.(*backend).spare = d }

// SetGCFloor makes c delete no document at or above the seq floor returns,
// so that a test can read every document of a chain before it goes.
func SetGCFloor(c *lock.Client, floor func() int64) { c.Backend.(*backend).gcFloor = floor }

// Keep, Spare and MarkTTL are what every real client uses.
const (
	Keep    = keep
	Spare   = spare
	MarkTTL = markTTL
)

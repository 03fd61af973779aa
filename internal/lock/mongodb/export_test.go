package mongodb

import "github.com/withlock/withlock/internal/lock"

// SetKeep changes how far below the newest document c keeps a name's
// documents (see keep). Every client of a name in a test must use the same.
func SetKeep(c *lock.Client, k int64) { c.Backend.(*backend).keep = k }

// SetGCFloor makes c delete no document at or above the seq floor returns,
// so that a test can read every document of a chain before it goes.
func SetGCFloor(c *lock.Client, floor func() int64) { c.Backend.(*backend).gcFloor = floor }

// Keep is the distance every real client uses.
const Keep = keep

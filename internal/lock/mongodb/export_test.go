package mongodb

import "github.com/withlock/withlock/internal/lock"

// SetKeep changes how far below the newest document c keeps a name's
// documents (see keep). Every client of a name in a test must use the same.
func SetKeep(c *lock.Client, k int64) { c.Backend.(*backend).keep = k }

// Keep is the distance every real client uses.
const Keep = keep

package lock

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"time"
)

// Holder is a process that holds a lock, as the backend recorded it. In
// Options it describes this process, and only Host, PID and Command are
// read. A field the backend cannot know is left zero (status shows null).
type Holder struct {
	Host    string
	PID     int
	Command []string
	// AcquiredAt is when the holder took the lock, by the server's clock
	// where the backend has one.
	AcquiredAt time.Time
	// ExpiresAt is when the holder's lease runs out unless renewed (lease
	// backends).
	ExpiresAt time.Time
	// Token is the holder's fencing token, where the backend gives one.
	Token int64
	// Session is what the server shows of the holder's connection, where
	// the lock lives in one (PostgreSQL: the server process, the role, the
	// client's address): how an operator finds it on the server, and all
	// there is to know of a holder that is not withlock. Empty elsewhere.
	Session string
}

// State is a lock as a backend sees it right now (withlock status).
type State struct {
	// Name is the lock's name; empty for a lock whose name the backend
	// cannot know, such as a PostgreSQL advisory lock taken by another
	// tool (Key then says which).
	Name string
	// Key is where the backend keeps the lock: a Redis key, a file, a pair
	// of advisory-lock keys.
	Key string
	// Mode is how the lock is held; empty when free or unknown.
	Mode Mode
	// MaxHolders is a semaphore's N, where the backend records it; zero
	// otherwise.
	MaxHolders int
	// Holders are the current holders, oldest first; none when free.
	Holders []Holder
}

// Hostname is os.Hostname, or "unknown".
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// NewToken returns 128 random bits in hex: a lease holder's proof that the
// lease is its own.
func NewToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

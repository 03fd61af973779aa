package cmd

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// A handle names one acquisition of withlock acquire: the lock, the
// backend it is in, and the keeper process that holds it. It is printed
// for the caller to pass to later steps, and holds no secret: each step
// gives the backend URL again.
type handle struct {
	V       int       `json:"v"`
	ID      string    `json:"id"`      // random: names the keeper's record
	Name    string    `json:"name"`    // NAME
	Backend string    `json:"backend"` // the backend URL without credentials or parameters
	Mode    lock.Mode `json:"mode"`
	N       int       `json:"n,omitempty"` // a semaphore's N
	Host    string    `json:"host"`        // the keeper's host and pid
	PID     int       `json:"pid"`
	// Start is when the keeper process started, in the kernel's terms
	// (clock ticks since boot): a pid reused after the keeper ended is
	// not mistaken for it.
	Start    uint64    `json:"start,omitempty"`
	Token    int64     `json:"token,omitempty"` // the fencing token, where the backend has one
	Acquired time.Time `json:"acquired"`
	MaxHold  string    `json:"max_hold"`
	// Lease mode (--detach lease): no keeper; the backend's ticket of the
	// lease, and the ttl it was given.
	Lease  bool   `json:"lease,omitempty"`
	Ticket string `json:"ticket,omitempty"`
	TTL    string `json:"ttl,omitempty"`
}

// maxHoldEnd is when --max-hold passes.
func (h handle) maxHoldEnd() time.Time {
	d, _ := time.ParseDuration(h.MaxHold)
	return h.Acquired.Add(d)
}

// handlePrefix starts every handle: the format's version.
const handlePrefix = "wlh1."

func (h handle) String() string {
	b, _ := json.Marshal(h)
	return handlePrefix + base64.RawURLEncoding.EncodeToString(b)
}

// parseHandle reads a handle as acquire printed it.
func parseHandle(s string) (handle, error) {
	var h handle
	s = strings.TrimSpace(s)
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, handlePrefix))
	if err != nil || !strings.HasPrefix(s, handlePrefix) || json.Unmarshal(b, &h) != nil || h.Name == "" || h.PID <= 0 {
		return handle{}, usagef("%q is not a handle printed by withlock acquire", abbreviate(s))
	}
	return h, nil
}

func abbreviate(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}

// backendID is the part of a backend URL that says which backend it is:
// scheme, hosts and path, without credentials or parameters, so that the
// same backend reached with another user or options is the same one.
func backendID(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return backendName(rawURL)
	}
	return backendName(rawURL) + "://" + strings.ToLower(u.Host) + strings.TrimSuffix(u.Path, "/")
}

// matches reports whether holder is the handle's keeper.
func (h handle) matches(holder lock.Holder) bool {
	return holder.Host == h.Host && holder.PID == h.PID && (h.Token == 0 || holder.Token == 0 || holder.Token == h.Token)
}

// local reports whether the keeper ran on this host.
func (h handle) local() bool { return h.Host == lock.Hostname() }

// keeperAlive reports whether the handle's keeper still runs (on this
// host).
func (h handle) keeperAlive() bool {
	if err := syscall.Kill(h.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if h.Start == 0 {
		return true // no start time here: the pid alone says
	}
	start, ok := processStart(h.PID)
	return ok && start == h.Start
}

// keeperRecord is what a keeper writes when it ends: why, and when.
type keeperRecord struct {
	Ended  time.Time `json:"ended"`
	Why    string    `json:"why"`              // one of the why* values
	Detail string    `json:"detail,omitempty"` // the error, for whyLost
}

// Why a keeper ended.
const (
	whyReleased = "released"
	whyLost     = "lost"
	whyMaxHold  = "max-hold"
	whyUntilPID = "until-pid"
	whyNoCaller = "no-caller"
)

// recordDir is where keepers leave their records: a directory of this
// user's own, in $XDG_RUNTIME_DIR or the temporary directory.
func recordDir() (string, error) {
	base := os.Getenv("XDG_RUNTIME_DIR")
	dir := filepath.Join(base, "withlock")
	if base == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("withlock-%d", os.Getuid()))
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// Another user's directory (or a link to one) in a shared /tmp is
	// not ours to trust.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || ok && int(st.Uid) != os.Getuid() {
		return "", fmt.Errorf("%s is not a directory of this user's", dir)
	}
	return dir, nil
}

// recordMaxAge is how long a keeper's record is kept: a pipeline's steps
// come within a day.
const recordMaxAge = 24 * time.Hour

// writeRecord records why the keeper of id ended. Records older than
// recordMaxAge are removed on the way.
func writeRecord(id string, r keeperRecord) {
	dir, err := recordDir()
	if err != nil {
		return
	}
	if old, _ := os.ReadDir(dir); len(old) > 0 {
		for _, e := range old {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > recordMaxAge {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	b, _ := json.Marshal(r)
	os.WriteFile(filepath.Join(dir, id+".json"), b, 0o600)
}

// readRecord returns the record of the keeper of id, if it left one here.
func readRecord(id string) (keeperRecord, bool) {
	var r keeperRecord
	dir, err := recordDir()
	if err != nil {
		return r, false
	}
	b, err := os.ReadFile(filepath.Join(dir, id+".json"))
	return r, err == nil && json.Unmarshal(b, &r) == nil
}

// ended says why the handle's keeper is no longer there, for an error
// message, from its record if it left one.
func (h handle) ended() string {
	if h.Lease {
		if time.Now().After(h.maxHoldEnd()) {
			return fmt.Sprintf("its --max-hold %s passed at %s", h.MaxHold, h.maxHoldEnd().Local().Format(time.RFC3339))
		}
		return "its lease was released, ran out (no renew within its ttl), or was broken"
	}
	r, ok := readRecord(h.ID)
	if !ok {
		if !h.local() {
			return fmt.Sprintf("its keeper (pid %d on %s) no longer holds it", h.PID, h.Host)
		}
		return fmt.Sprintf("its keeper (pid %d) has ended", h.PID)
	}
	at := r.Ended.Local().Format(time.RFC3339)
	switch r.Why {
	case whyReleased:
		return "it was released already, at " + at
	case whyMaxHold:
		return fmt.Sprintf("its --max-hold %s passed at %s and it was released", h.MaxHold, at)
	case whyUntilPID:
		return "the process of --until-pid ended and it was released, at " + at
	case whyNoCaller:
		return "withlock acquire ended before it could print the handle, and it was released at " + at
	}
	return fmt.Sprintf("it was lost at %s: %s", at, r.Detail)
}

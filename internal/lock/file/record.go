package file

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// record is what a holder writes into the file it holds: who it is, for
// status, and which process exactly (pid and start time), so that release
// --force signals that withlock and never a process that got its pid later.
type record struct {
	// Withlock is the format's version, 1. It comes first, so that a
	// record is known by its first bytes (magic).
	Withlock   int       `json:"withlock"`
	Name       string    `json:"name"`
	Mode       lock.Mode `json:"mode"`
	MaxHolders int       `json:"max_holders,omitempty"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	// Start is the process's start time in clock ticks after boot (field
	// 22 of /proc/PID/stat): with PID, it names one process for the life
	// of the host.
	Start      uint64    `json:"start"`
	Command    []string  `json:"command"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// magic starts every record.
var magic = []byte(`{"withlock":1,`)

// errForeign says a lock file holds something other than a record.
var errForeign = errors.New("holds something other than a withlock record; it is locked but not written")

// maxRecord bounds a record; a longer command is cut.
const maxRecord = 64 << 10

// self is this process, as records name it.
var self = sync.OnceValues(func() (record, error) {
	pid := os.Getpid()
	start, err := procStart(pid)
	return record{Withlock: 1, Host: lock.Hostname(), PID: pid, Start: start}, err
})

func (r record) encode() []byte {
	data, _ := json.Marshal(r)
	if len(data) > maxRecord && len(r.Command) > 0 {
		r.Command = []string{r.Command[0][:min(len(r.Command[0]), 1024)], fmt.Sprintf("(%d more arguments, cut)", len(r.Command)-1)}
		data, _ = json.Marshal(r)
	}
	return append(data, '\n')
}

// writeRecord writes r into f through f's own descriptor, the one that
// holds the lock, if f is empty or already holds a record: a file that
// holds anything else is locked but never written. It writes the new
// record over the old one and then cuts the rest, so that a reader sees
// a whole line either way.
func writeRecord(f *os.File, r record) error {
	head := make([]byte, len(magic))
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if n > 0 && !bytes.Equal(head[:n], magic[:n]) {
		return fmt.Errorf("%s: %w", f.Name(), errForeign)
	}
	data := r.encode()
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.Truncate(int64(len(data)))
}

// clearRecord empties f, which holds our record, before the lock is let
// go.
func clearRecord(f *os.File) error { return f.Truncate(0) }

// readRecord reads the record in f, if it holds one.
func readRecord(f *os.File) (record, bool) {
	buf := make([]byte, maxRecord+1)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return record{}, false
	}
	line, _, found := bytes.Cut(buf[:n], []byte("\n"))
	if !found || !bytes.HasPrefix(line, magic) {
		return record{}, false
	}
	var r record
	if json.Unmarshal(line, &r) != nil || r.PID <= 0 {
		return record{}, false
	}
	return r, true
}

// live reports whether r was written by a process that still runs on this
// host: the same pid and the same start time. A record is cleared when its
// lock is let go, so a live record is its holder's; a dead one was left by
// a holder that crashed.
func (r record) live() bool {
	me, err := self()
	if err != nil || r.Host != me.Host {
		return false
	}
	start, err := procStart(r.PID)
	return err == nil && start == r.Start
}

// holder is the record as status shows it.
func (r record) holder() lock.Holder {
	return lock.Holder{Host: r.Host, PID: r.PID, Command: r.Command, AcquiredAt: r.AcquiredAt}
}

// procStart reads a process's start time from /proc/PID/stat (field 22,
// counted after the command name, which may hold spaces and parentheses).
func procStart(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

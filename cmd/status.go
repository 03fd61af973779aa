package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/withlock/withlock/internal/lock"
)

// statusFlags are the flags of withlock status.
type statusFlags struct {
	connFlags
	handleFlags
	json bool
}

func newStatusCmd(env *environment) *cobra.Command {
	f := &statusFlags{}
	c := &cobra.Command{
		Use:   "status [flags] [NAME]",
		Short: "Show who holds NAME, or list every lock held",
		Long: `status shows whether NAME is held and, if so, by whom (every holder of a
shared lock or semaphore: host, pid, command), since when, until when (lease
backends) and with which fencing token; for a semaphore, its N. Without
NAME it lists every lock held right now, one line each, including other
tools' locks where the backend can see them: PostgreSQL advisory locks,
MySQL GET_LOCKs on withlock's keys, etcdctl's keys, flock(1)'s lock files.
It changes nothing.

OUTPUT

One line per lock on stdout. With --json, one JSON object per lock: name,
backend, held, mode (exclusive, shared or semaphore), max_holders, holders
(each with host, pid, command, acquired_at, expires_at and token), and the
first holder's fields again at the top level. pid and token are integers,
times RFC 3339 strings; a field the backend cannot know is null. When NAME
is free, held is false and holders is empty.

RIGHTS

- PostgreSQL: anyone sees that a lock is held; its holder's command and
  time need the holders' role, a superuser or pg_read_all_stats.
- MySQL: anyone sees that NAME is held; the holder's record needs
  performance_schema and SELECT on it; a list without NAME needs its
  metadata_locks (or MariaDB's metadata_lock_info), else exit 64.
- Redis: read on withlock:* keys; MongoDB: find on the locks collection;
  etcd: read on NAME/ (every key, without NAME); Kubernetes: get and list on
  leases; S3: s3:GetObject, and s3:ListBucket without NAME; file: read DIR.

ENVIRONMENT

- WITHLOCK_DB, PG_CONNECTION_STRING: the backend URL when --db is not given.
- SSL_CERT_FILE, SSL_CERT_DIR, KUBECONFIG: as for withlock(1).

A HANDLE

status --handle H (or --handle-file F) shows the lock of a handle from
withlock acquire, and exits 70 once the handle no longer holds it: a step
checks with it before it relies on the lock. With --json, the object has
"handle_holds": true or false, and the handle's holder is first, with its
fencing token.

EXIT STATUS

- 0: NAME is held or free; or the list was printed. With --handle: the
  handle holds NAME.
- 64: usage: a bad URL or NAME, more than one NAME.
- 69: the backend is unavailable, or refused.
- 70: with --handle: the handle no longer holds its lock; it says why.`,
		Example: `  withlock status --db postgres://ops@db.internal/app dbmigration
  withlock status --json dbmigration | jq .holders
  withlock status --db redis://cache.internal`,
		Args: func(_ *cobra.Command, args []string) error {
			if f.handleFlags.given() && len(args) > 0 {
				return usagef("status --handle takes no NAME: the handle names it")
			}
			if len(args) > 1 {
				return usagef("status takes one NAME, or none to list every lock held, not %d arguments", len(args))
			}
			return nil
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if f.handleFlags.given() {
				_, err := openHandle(env, &f.connFlags, &f.handleFlags, func(ctx context.Context, client *lock.Client, h handle) error {
					st, err := h.held(ctx, client)
					if errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused) {
						return err
					}
					f.printHandle(env.stdout, st, h, err == nil)
					return err
				})
				return err
			}
			client, err := f.open(env)
			if err != nil {
				return err
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout)
			defer cancel()
			if len(args) == 0 {
				states, err := client.List(ctx)
				if err != nil {
					return err
				}
				for _, st := range states {
					f.print(env.stdout, st, backendName(f.db), false)
				}
				return nil
			}
			st, err := client.Inspect(ctx, args[0])
			if err != nil {
				return err
			}
			f.print(env.stdout, st, backendName(f.db), true)
			return nil
		},
	}
	f.connFlags.register(c.Flags())
	f.handleFlags.register(c.Flags())
	completeFlags(c)
	c.ValidArgsFunction = f.completeHeld(env)
	oneAttempt(c.Flags())
	c.Flags().BoolVar(&f.json, "json", false, "print one JSON object per lock")
	return c
}

func (f *statusFlags) print(w io.Writer, st lock.State, backend string, detail bool) {
	if f.json {
		b, _ := json.Marshal(statusJSON(st, backend))
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	fmt.Fprintln(w, describe(st))
	if detail && len(st.Holders) > 1 {
		for _, h := range st.Holders {
			fmt.Fprintln(w, "  "+describeHolder(h))
		}
	}
}

// printHandle prints NAME's state for status --handle: the handle's
// holder first, and with --json whether the handle holds NAME.
func (f *statusFlags) printHandle(w io.Writer, st lock.State, h handle, holds bool) {
	for i, holder := range st.Holders {
		if h.matches(holder) {
			st.Holders[0], st.Holders[i] = st.Holders[i], st.Holders[0]
		}
	}
	if !f.json {
		f.print(w, st, backendName(f.db), true)
		return
	}
	obj := statusJSON(st, backendName(f.db))
	obj.HandleHolds = &holds
	b, _ := json.Marshal(obj)
	fmt.Fprintf(w, "%s\n", b)
}

// describe is a lock's state on one line:
//
//	dbmigration: held (exclusive) by web-1 pid 4242 since 2026-11-22T10:00:00Z until 2026-11-22T10:00:15Z, token 7: migrate up
//	reports: held (semaphore of 3) by 2 holders: web-1 pid 4242, web-2 pid 17
//	dbmigration: free
func describe(st lock.State) string {
	name := st.Name
	if name == "" {
		name = st.Key
	}
	name = printable(name)
	if len(st.Holders) == 0 {
		return name + ": free"
	}
	return name + ": " + heldText(st)
}

// heldText says how and by whom a held lock is held: "held (exclusive) by
// web-1 pid 4242 since ...: migrate up".
func heldText(st lock.State) string {
	mode := string(st.Mode)
	if st.Mode == lock.Semaphore && st.MaxHolders > 0 {
		mode = fmt.Sprintf("semaphore of %d", st.MaxHolders)
	}
	head := "held"
	if mode != "" {
		head += " (" + mode + ")"
	}
	if len(st.Holders) == 1 {
		return head + " by " + describeHolder(st.Holders[0])
	}
	var who []string
	for _, h := range st.Holders {
		who = append(who, holderID(h))
	}
	return fmt.Sprintf("%s by %d holders: %s", head, len(st.Holders), strings.Join(who, ", "))
}

// holderID is "host pid N", or what of it is known.
func holderID(h lock.Holder) string {
	var parts []string
	if h.Host != "" {
		parts = append(parts, printable(h.Host))
	}
	if h.PID != 0 {
		parts = append(parts, "pid "+strconv.Itoa(h.PID))
	}
	if len(parts) == 0 {
		return "an unknown holder"
	}
	return strings.Join(parts, " ")
}

func describeHolder(h lock.Holder) string {
	s := holderID(h)
	if !h.AcquiredAt.IsZero() {
		s += " since " + rfc3339(h.AcquiredAt)
	}
	if !h.ExpiresAt.IsZero() {
		s += " until " + rfc3339(h.ExpiresAt)
	}
	if h.Token != 0 {
		s += ", token " + strconv.FormatInt(h.Token, 10)
	}
	if h.Session != "" {
		s += " (" + h.Session + ")"
	}
	if len(h.Command) > 0 {
		args := make([]string, len(h.Command))
		for i, a := range h.Command {
			args[i] = printable(a)
		}
		s += ": " + strings.Join(args, " ")
	}
	return s
}

// printable is s for a line of text output: s itself if every character
// of it is printable, else s quoted as Go quotes strings ("a\nb"), so that
// a NAME or an argument with a newline or an escape sequence keeps to its
// line and cannot move the terminal's cursor.
func printable(s string) string {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
		return strconv.Quote(s)
	}
	return s
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// holderFields are the JSON fields of one holder (docs/behaviour.md,
// Inspecting and breaking); null where the
// backend cannot know.
type holderFields struct {
	Host       *string  `json:"host"`
	PID        *int     `json:"pid"`
	Command    []string `json:"command"`
	AcquiredAt *string  `json:"acquired_at"`
	ExpiresAt  *string  `json:"expires_at"`
	Token      *int64   `json:"token"`
	// Session is not one of the contract's fields; it appears only where the
	// backend has one (PostgreSQL).
	Session string `json:"session,omitempty"`
}

// statusObject is withlock status --json's object: the lock, every holder,
// and the first holder's fields again at the top, for scripts written for
// exclusive locks.
type statusObject struct {
	Name       *string        `json:"name"`
	Key        string         `json:"key,omitempty"`
	Backend    string         `json:"backend"`
	Held       bool           `json:"held"`
	Mode       *string        `json:"mode"`
	MaxHolders *int           `json:"max_holders"`
	Holders    []holderFields `json:"holders"`
	holderFields
	// HandleHolds is, for status --handle, whether the handle holds NAME.
	HandleHolds *bool `json:"handle_holds,omitempty"`
}

func statusJSON(st lock.State, backend string) statusObject {
	o := statusObject{Backend: backend, Held: len(st.Holders) > 0, Holders: []holderFields{}}
	// key is for a lock whose name the backend cannot know, and only for
	// one: a named lock's key is the backend's business.
	if st.Name != "" {
		o.Name = &st.Name
	} else {
		o.Key = st.Key
	}
	if o.Held && st.Mode != "" {
		mode := string(st.Mode)
		o.Mode = &mode
		switch {
		case st.Mode == lock.Exclusive:
			one := 1
			o.MaxHolders = &one
		case st.MaxHolders > 0:
			n := st.MaxHolders
			o.MaxHolders = &n
		}
	}
	for _, h := range st.Holders {
		o.Holders = append(o.Holders, holderJSON(h))
	}
	if o.Held {
		o.holderFields = o.Holders[0]
	}
	return o
}

func holderJSON(h lock.Holder) holderFields {
	var f holderFields
	if h.Host != "" {
		f.Host = &h.Host
	}
	if h.PID != 0 {
		f.PID = &h.PID
	}
	f.Command = h.Command
	if !h.AcquiredAt.IsZero() {
		s := rfc3339(h.AcquiredAt)
		f.AcquiredAt = &s
	}
	if !h.ExpiresAt.IsZero() {
		s := rfc3339(h.ExpiresAt)
		f.ExpiresAt = &s
	}
	if h.Token != 0 {
		f.Token = &h.Token
	}
	f.Session = h.Session
	return f
}

// backendName is the backend's name for status output: its URL scheme
// without variants (postgresql is postgres, rediss is redis).
func backendName(rawURL string) string {
	scheme, _, _ := strings.Cut(rawURL, "://")
	scheme = strings.ToLower(scheme)
	switch scheme {
	case "postgresql":
		return "postgres"
	case "rediss", "redis+sentinel":
		return "redis"
	case "mongodb+srv":
		return "mongodb"
	case "etcds":
		return "etcd"
	case "kubernetes":
		return "k8s"
	}
	return scheme
}

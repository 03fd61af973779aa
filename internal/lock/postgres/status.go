package postgres

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// status and release --force read pg_locks, the lock manager's own table
// (every role may read it), joined with pg_stat_activity for what each
// holding session shows: its record (record.go), its application_name,
// its client's address. Roles other than the holder's see only the
// application_name there, unless they have pg_read_all_stats.

// nameLocks selects NAME's locks in pg_locks l: its two keys ($2, $3, as
// pg_locks shows them, unsigned), its slots (classid $4, upper objid $5)
// and its marks of N ($6, $7); see semaphore.go.
const nameLocks = `((l.objsubid = 2 and l.classid::pg_catalog.int8 = $2 and l.objid::pg_catalog.int8 = $3)
	or (l.objsubid = 1 and l.classid::pg_catalog.int8 = $4 and l.objid::pg_catalog.int8 >> 16 = $5)
	or (l.objsubid = 1 and l.classid::pg_catalog.int8 = $6 and l.objid::pg_catalog.int8 >> 16 = $7))`

// sessionColumns are what pg_stat_activity a shows of a session.
const sessionColumns = `a.usename, a.application_name, pg_catalog.host(a.client_addr), a.client_hostname, a.client_port,
	a.backend_start, a.state, a.state_change, a.query, pg_catalog.statement_timestamp()`

// statusSQL lists the advisory locks granted in this database (to
// sessions other than the asking one), each with its holder's session:
// all of them ($1), or NAME's. Its first column says whether the server
// is a hot standby, where pg_locks knows nothing of the primary's locks;
// the other columns are null when nothing is held.
const statusSQL = `select r.standby, x.* from (select pg_catalog.pg_is_in_recovery() as standby) r
left join (select l.pid, l.objsubid::pg_catalog.int4, l.classid::pg_catalog.int8, l.objid::pg_catalog.int8, l.mode = 'ExclusiveLock',
		` + sessionColumns + `
	from pg_catalog.pg_locks l left join pg_catalog.pg_stat_activity a on a.pid = l.pid
	where l.locktype = 'advisory' and l.granted and l.` + thisDB + ` and l.pid <> pg_catalog.pg_backend_pid()
		and ($1 or ` + nameLocks + `)) x on not r.standby`

// session is what pg_stat_activity shows of a session; nil pointers are
// what it does not show (to a role without the privilege to see them).
type session struct {
	pid                       int64
	user, app, addr, hostname *string
	port                      *int32
	started, stateChange      *time.Time
	state, query              *string
	now                       *time.Time // the asking statement's start
}

func (s *session) columns() []any {
	return []any{&s.user, &s.app, &s.addr, &s.hostname, &s.port, &s.started, &s.state, &s.stateChange, &s.query, &s.now}
}

// appName is withlock's application_name (cut at 63 bytes by the server).
var appName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^withlock (\d+)@(\S+)(?: (.*))?$`) })

// holder is what s shows of its holder, and the lock name the session
// says it holds ("" if it says none). The record is the source; failing
// that (another role's session, a record cut short) the application_name;
// failing that (another tool) the client's address.
func (s *session) holder() (lock.Holder, string) {
	h := lock.Holder{}
	name := ""
	if r, ok := parseRecord(deref(s.query)); ok {
		h.Host, h.PID, h.Command, name = r.Host, r.PID, r.Command, r.Name
		switch {
		case r.At != nil:
			h.AcquiredAt = *r.At
		case deref(s.state) == "active":
			h.AcquiredAt = deref(s.now) // granted; the statement has yet to return
		case s.stateChange != nil:
			h.AcquiredAt = *s.stateChange // when the statement that took it returned
		}
	} else if m := appName().FindStringSubmatch(deref(s.app)); m != nil {
		h.PID, _ = strconv.Atoi(m[1])
		h.Host, name = m[2], m[3]
	} else {
		h.Host = s.client()
	}
	h.Session = s.describe(h.AcquiredAt.IsZero())
	return h, name
}

// client is the client's host name or address, "local" for a Unix socket.
func (s *session) client() string {
	switch {
	case deref(s.hostname) != "":
		return *s.hostname
	case s.addr != nil:
		return *s.addr
	case s.port != nil && *s.port == -1:
		return "local"
	}
	return ""
}

// describe is the session for lock.Holder.Session: "postgres pid 4242,
// user app, from 10.0.0.7", and what else it shows of a holder that is not
// withlock (its application_name, when it connected).
func (s *session) describe(connected bool) string {
	parts := []string{"postgres pid " + strconv.FormatInt(s.pid, 10)}
	if s.user != nil {
		parts = append(parts, "user "+*s.user)
	}
	if app := deref(s.app); app != "" && !appName().MatchString(app) {
		parts = append(parts, "application_name "+strconv.Quote(app))
	}
	if c := s.client(); c != "" {
		parts = append(parts, "from "+c)
	}
	if connected && s.started != nil {
		parts = append(parts, "connected "+s.started.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// lockRow is one granted lock of statusSQL.
type lockRow struct {
	subid          int32 // 2: two int4 keys; 1: one bigint
	classid, objid int64
	exclusive      bool
	s              *session
}

// status runs statusSQL: every lock (sem nil), or sem's name's.
func (b *backend) status(ctx context.Context, sem *semaphore) ([]lockRow, error) {
	name := ""
	if sem != nil {
		name = sem.name
	}
	conn, err := b.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	args := []any{sem == nil, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)}
	if sem != nil {
		args = append(args[:1], sem.nameArgs()...)
	}
	rows, _ := conn.Query(ctx, statusSQL, args...)
	var (
		out      []lockRow
		standby  bool
		sessions = map[int64]*session{}
	)
	for rows.Next() {
		var (
			pid   *int64
			r     lockRow
			s     session
			subid *int32
			c, o  *int64
			excl  *bool
		)
		if err := rows.Scan(append([]any{&standby, &pid, &subid, &c, &o, &excl}, s.columns()...)...); err != nil {
			rows.Close()
			return nil, b.failed(err)
		}
		if pid == nil {
			continue // nothing held (or a standby)
		}
		s.pid = *pid
		if sessions[s.pid] == nil {
			sessions[s.pid] = &s
		}
		r.subid, r.classid, r.objid, r.exclusive, r.s = *subid, *c, *o, *excl, sessions[s.pid]
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, b.failed(err)
	}
	if standby {
		return nil, b.standby()
	}
	return out, nil
}

// nameArgs are nameLocks' $2-$7 for sem's name.
func (s *semaphore) nameArgs() []any {
	return []any{int64(uint32(s.k1)), int64(uint32(s.k2)), s.slotHi, s.slotMid, s.markHi, s.markMid}
}

// Inspect returns name's holders: the sessions that hold its keys, or one
// of its slots. A semaphore's N is its holders' mark.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	sem := newSemaphore(name, 1)
	rows, err := b.status(ctx, sem)
	if err != nil {
		return lock.State{}, err
	}
	g := newGroup(name, "")
	for _, r := range rows {
		switch {
		case r.subid == 2:
			g.add(r.s, r.exclusive, false)
		case r.classid == sem.slotHi && r.objid>>16 == sem.slotMid:
			g.add(r.s, false, true)
		default: // a mark of N
			g.n = int(r.objid & 0xffff)
		}
	}
	return g.state(), nil
}

// List returns every advisory lock held in the URL's database, by anyone.
// A lock is named where one of its holders says (in its record or its
// application_name) a name whose keys are the lock's; the slots and mark
// of a named semaphore are its holders'. Any other lock (another tool's,
// or one whose holders show nothing) is listed by its keys.
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	rows, err := b.status(ctx, nil)
	if err != nil {
		return nil, err
	}
	groups := map[[2]int64]*group{}
	var order [][2]int64
	get := func(key [2]int64, display string) *group {
		if groups[key] == nil {
			groups[key] = newGroup("", display)
			order = append(order, key)
		}
		return groups[key]
	}
	// The two-key locks, named where a holder says so.
	for _, r := range rows {
		if r.subid != 2 {
			continue
		}
		k1, k2 := int32(uint32(r.classid)), int32(uint32(r.objid))
		g := get([2]int64{r.classid, r.objid}, fmt.Sprintf("advisory lock (%d, %d)", k1, k2))
		g.add(r.s, r.exclusive, false)
		if _, name := r.s.holder(); name != "" && g.name == "" {
			if n1, n2 := Keys(name); n1 == k1 && n2 == k2 {
				g.name = name
			}
		}
	}
	// The bigint locks: a semaphore's slots and mark go with its name's
	// keys, which each of its holders holds too.
	sems := map[*session][]*semaphore{}
	for _, key := range order {
		if g := groups[key]; g.name != "" {
			for _, s := range g.sessions {
				sems[s] = append(sems[s], newSemaphore(g.name, 1))
			}
		}
	}
	var foreign []lockRow
rows:
	for _, r := range rows {
		if r.subid == 2 {
			continue
		}
		for _, sem := range sems[r.s] {
			g := groups[[2]int64{int64(uint32(sem.k1)), int64(uint32(sem.k2))}]
			switch {
			case r.classid == sem.slotHi && r.objid>>16 == sem.slotMid:
				g.add(r.s, false, true)
				continue rows
			case r.classid == sem.markHi && r.objid>>16 == sem.markMid:
				g.n = int(r.objid & 0xffff)
				continue rows
			}
		}
		foreign = append(foreign, r)
	}
	for _, r := range foreign {
		key := r.classid<<32 | r.objid
		// Keyed apart from the two-key locks: no pg_locks classid is negative.
		get([2]int64{-1, key}, fmt.Sprintf("advisory lock (%d)", key)).add(r.s, r.exclusive, false)
	}
	var out []lock.State
	for _, key := range order {
		out = append(out, groups[key].state())
	}
	return out, nil
}

// group gathers one lock's holders.
type group struct {
	name, key string
	sessions  []*session
	exclusive bool // held exclusively
	slots     bool // some hold it as a semaphore's slots
	n         int  // the semaphore's N, from its mark
}

func newGroup(name, key string) *group { return &group{name: name, key: key} }

func (g *group) add(s *session, exclusive, slot bool) {
	g.exclusive = g.exclusive || exclusive
	g.slots = g.slots || slot
	if !slices.Contains(g.sessions, s) {
		g.sessions = append(g.sessions, s)
	}
}

func (g *group) state() lock.State {
	st := lock.State{Name: g.name}
	if g.name == "" {
		st.Key = g.key
	}
	for _, s := range g.sessions {
		h, _ := s.holder()
		st.Holders = append(st.Holders, h)
	}
	switch {
	case len(st.Holders) == 0:
	case g.exclusive:
		st.Mode = lock.Exclusive
	case g.slots:
		st.Mode, st.MaxHolders = lock.Semaphore, g.n
	default:
		st.Mode = lock.Shared
	}
	return st
}

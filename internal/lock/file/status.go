package file

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"

	"github.com/withlock/withlock/internal/lock"
)

// holder is a holder as status found it.
type holder struct {
	lock.Holder
	pid    int     // the holding process as /proc/locks shows it; 0 on another host
	rec    *record // its live record, if it wrote one
	remote bool    // held from another host (per its record), through a shared filesystem
}

// seen is a lock file as status found it.
type seen struct {
	state   lock.State
	holders []holder
	id      fileID
}

// Inspect says who holds name: the holders are the processes that
// /proc/locks shows holding its lock file, with the details of their
// records where they left one (withlock) and what /proc shows otherwise
// (flock(1) and other tools: pid and command line).
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	s, err := b.look(FileName(name))
	s.state.Name, s.state.Key = name, ""
	return s.state, err
}

// List returns the state of every lock file in DIR that someone holds.
// Its Name is the one in the holders' records, else the one the file's
// name escapes (none for a hashed name: Key says which file).
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	entries, err := os.ReadDir(b.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	var states []lock.State
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") || !e.Type().IsRegular() {
			continue
		}
		s, err := b.look(e.Name())
		if errors.Is(err, lock.ErrUnavailable) {
			return nil, err // no /proc/locks
		}
		if err == nil && len(s.state.Holders) > 0 {
			states = append(states, s.state)
		}
	}
	return states, nil
}

// look finds who holds the lock file f. A record is written just after
// its holder took its slot and cleared just before it lets go, so a slot
// held without a record is changing hands: look again, a few times.
func (b *backend) look(f string) (seen, error) {
	for range 20 {
		s, settled, err := b.lookOnce(f)
		if err != nil || settled {
			return s, err
		}
	}
	s, _, err := b.lookOnce(f)
	return s, err
}

func (b *backend) lookOnce(f string) (s seen, settled bool, err error) {
	path := b.path(f)
	s = seen{state: lock.State{Name: nameOf(f)}}
	main, err := openRead(path)
	if main == nil {
		return s, true, err
	}
	defer main.Close()
	if s.id, err = idOf(main); err != nil {
		return s, true, lock.Errorf(lock.ErrUnavailable, "file: stat %s: %v", path, err)
	}
	mainRec, hasRec := readRecord(main)
	slots, shared := b.slotRecords(f, SlotName), b.slotRecords(f, SharedName)
	ids := []fileID{s.id}
	for _, sl := range append(slots, shared...) {
		ids = append(ids, sl.id)
	}
	locks, err := procLocks(ids)
	if err != nil {
		return s, true, err
	}
	for _, sls := range [][]slotRecord{slots, shared} {
		for i, sl := range sls {
			for _, lk := range locks[sl.id] {
				if lk.write {
					sls[i].pid = lk.pid
				}
			}
		}
	}
	lockers := locks[s.id]
	settled = true
	if len(lockers) == 0 {
		s.holders = remoteHolders(main, mainRec, hasRec, append(slots, shared...))
	} else {
		s.holders, s.state.Mode, settled = localHolders(lockers, mainRec, hasRec, slots, shared)
	}
	for _, h := range s.holders {
		s.state.Holders = append(s.state.Holders, h.Holder)
		if h.rec == nil {
			continue
		}
		if h.rec.Name != "" {
			s.state.Name = h.rec.Name
		}
		if s.state.Mode == "" {
			s.state.Mode = h.rec.Mode // another host's
		}
		if h.rec.Mode == lock.Semaphore && s.state.Mode == lock.Semaphore {
			s.state.MaxHolders = h.rec.MaxHolders
		}
	}
	if s.state.Name == "" {
		s.state.Key = path // a hashed name that no record names
	}
	if len(s.holders) == 0 {
		s.state.Mode = ""
	}
	return s, settled, nil
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// localHolders pairs the processes that /proc/locks shows holding the lock
// file with their records, and says how the lock is held. An exclusive
// holder's record is in the lock file; a semaphore holder's in its slot, a
// shared holder's in its record file, paired with it by pid (in order, when
// one process holds more than one).
//
// The locks alone say the mode: an exclusive flock is exclusive; shared
// flocks are a semaphore's if a holder of the lock file holds a slot too,
// and then its holders are those that do (a contender holds the lock file
// shared for a moment before it finds every slot taken, and is no holder);
// else they are shared, as flock -s. settled is false if a holder of a
// slot or record file has no record there (yet, or any more).
func localHolders(lockers []procLock, mainRec record, hasRec bool, slots, shared []slotRecord) (hs []holder, mode lock.Mode, settled bool) {
	slotsOf, slotRecs := byPID(slots)
	sharedOf, sharedRecs := byPID(shared)
	settled = true
	mode = lock.Shared
	for _, lk := range lockers {
		switch {
		case lk.write:
			mode = lock.Exclusive
		case slotsOf[lk.pid] > 0:
			mode = lock.Semaphore
		}
	}
	for _, lk := range lockers {
		var r *record
		switch {
		case lk.write:
			if hasRec && mainRec.PID == lk.pid && mainRec.live() {
				r = &mainRec
			}
		case mode == lock.Semaphore:
			if slotsOf[lk.pid] == 0 {
				continue
			}
			slotsOf[lk.pid]--
			r = next(slotRecs, lk.pid)
			settled = settled && r != nil
		default:
			r = next(sharedRecs, lk.pid)
			if sharedOf[lk.pid] > 0 {
				sharedOf[lk.pid]--
				settled = settled && r != nil
			}
		}
		h := holder{pid: lk.pid, rec: r}
		if r != nil {
			h.Holder = r.holder()
		} else {
			h.Holder = lock.Holder{Host: lock.Hostname(), PID: lk.pid, Command: cmdline(lk.pid)}
		}
		hs = append(hs, h)
	}
	return hs, mode, settled
}

// byPID counts the held slots by holder and gathers their live records.
func byPID(slots []slotRecord) (map[int]int, map[int][]record) {
	held, recs := map[int]int{}, map[int][]record{}
	for _, sl := range slots {
		if sl.pid == 0 {
			continue
		}
		held[sl.pid]++
		if sl.ok && sl.rec.PID == sl.pid && sl.rec.live() {
			recs[sl.pid] = append(recs[sl.pid], sl.rec)
		}
	}
	return held, recs
}

// next takes the next record of pid off recs.
func next(recs map[int][]record, pid int) *record {
	rs := recs[pid]
	if len(rs) == 0 {
		return nil
	}
	recs[pid] = rs[1:]
	return &rs[0]
}

// slotRecord is a slot or a shared holder's record file: the file, its
// record if it holds one, and who holds it here (0: nobody).
type slotRecord struct {
	id  fileID
	rec record
	ok  bool
	pid int
}

// slotRecords reads f's slots (SlotName) or shared holders' record files
// (SharedName), from the 0th to the first that does not exist.
func (b *backend) slotRecords(f string, fileK func(string, int) string) []slotRecord {
	var out []slotRecord
	for k := 0; ; k++ {
		s, _ := openRead(b.path(fileK(f, k)))
		if s == nil {
			return out
		}
		var sr slotRecord
		var err error
		sr.rec, sr.ok = readRecord(s)
		sr.id, err = idOf(s)
		s.Close()
		if err == nil {
			out = append(out, sr)
		}
	}
}

// remoteHolders: /proc/locks shows nobody holding the lock file here. If
// records say another host's withlock holds it (a shared filesystem), one
// attempt to lock the file tells whether it is held; if it is, those
// records are its holders, as far as anyone here can tell.
func remoteHolders(main *os.File, mainRec record, hasRec bool, slots []slotRecord) []holder {
	me := lock.Hostname()
	var recs []record
	if hasRec && mainRec.Host != me {
		recs = append(recs, mainRec)
	} else {
		for _, sl := range slots {
			if sl.ok && sl.rec.Host != me {
				recs = append(recs, sl.rec)
			}
		}
	}
	if len(recs) == 0 {
		return nil
	}
	if flock(main, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		flock(main, syscall.LOCK_UN)
		return nil // left behind by holders that are gone
	}
	var hs []holder
	for _, r := range recs {
		hs = append(hs, holder{Holder: r.holder(), rec: &r, remote: true})
	}
	return hs
}

package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// replication lets a cluster send WAL to standbys; the template's wal_level =
// minimal cannot.
const replication = "wal_level = replica\nmax_wal_senders = 4"

// StartStandby makes a hot standby of p, as a user would: pg_basebackup -R
// copies p into a new cluster that streams from p, started on a port of its own.
// The first call restarts p once (Configure) so that it can send WAL. The caller
// must Close the standby. Its URL connects as p's does; there
// pg_is_in_recovery() is true and writes fail.
func (p *Postgres) StartStandby() (*Postgres, error) {
	p.mu.Lock()
	configured := strings.Contains(p.conf, replication)
	p.mu.Unlock()
	if !configured {
		if err := p.Configure(replication); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(p.inst.clusterBase(), "withlock-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	s := &Postgres{Dir: dir, inst: p.inst}
	if err := s.makeStandbyOf(p); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Postgres) makeStandbyOf(p *Postgres) error {
	if err := s.inst.chown(s.Dir); err != nil {
		return err
	}
	p.mu.Lock()
	s.conf = p.conf // the standby's settings must match the primary's
	p.mu.Unlock()
	basebackup := filepath.Join(filepath.Dir(s.inst.pgCtl), "pg_basebackup")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s", p.Port, PostgresUser, PostgresPassword)
	if out, err := s.inst.run(s.Dir, basebackup, "-D", s.dataDir(), "-R", "-X", "stream", "-c", "fast", "-d", conninfo); err != nil {
		return fmt.Errorf("testenv: pg_basebackup: %w\n%s", err, out)
	}
	if err := s.startWatchdog(); err != nil {
		return err
	}
	return s.listen() // pg_ctl start -w waits until it accepts read-only connections
}

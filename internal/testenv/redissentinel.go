package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisMasterName is the name the Sentinels of a [RedisSentinel] know the
// primary by.
const RedisMasterName = "locks"

// RedisSentinel is a Sentinel-managed Redis on 127.0.0.1: a primary and a
// replica (Servers, the primary first until a failover) and three
// Sentinels that watch them, agreeing on a failure with two votes and
// deciding that a server is down after a second of silence.
//
// Its URL is redis+sentinel://:PASSWORD@127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/locks.
type RedisSentinel struct {
	URL       string
	Servers   []*Redis
	Sentinels []*proc
}

// StartRedisSentinel starts the primary, its replica and three Sentinels,
// and returns once every Sentinel knows the replica and the other two.
// Of opts, only Password counts.
func StartRedisSentinel(opts ...RedisOptions) (*RedisSentinel, error) {
	o := append(opts, RedisOptions{})[0]
	bin := findProgram("redis-server")
	if bin == "" {
		return nil, ErrNoRedis
	}
	s := &RedisSentinel{}
	primary, err := StartRedis(RedisOptions{Password: o.Password})
	if err != nil {
		return nil, err
	}
	s.Servers = append(s.Servers, primary)
	if o.Password != "" {
		// After a failover the old primary replicates from the new one.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := RedisDo(ctx, primary.URL, "CONFIG", "SET", "masterauth", o.Password)
		cancel()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("testenv: sentinel: %w", err)
		}
	}
	replica, err := StartRedis(RedisOptions{Password: o.Password, ReplicaOf: primary})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.Servers = append(s.Servers, replica)
	var hosts []string
	for range 3 {
		p, err := newProc(os.TempDir(), "sentinel", nil, false)
		if err != nil {
			s.Close()
			return nil, err
		}
		p.command = func() *exec.Cmd {
			// Sentinel rewrites its configuration file as it learns.
			conf := fmt.Sprintf("bind 127.0.0.1\nport %d\ndir %q\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %[3]s 1000\nsentinel failover-timeout %[3]s 10000\n",
				p.Port, p.Dir, RedisMasterName, primary.Port)
			if o.Password != "" {
				conf += fmt.Sprintf("sentinel auth-pass %s %q\n", RedisMasterName, o.Password)
			}
			os.WriteFile(filepath.Join(p.Dir, "sentinel.conf"), []byte(conf), 0o600)
			return exec.Command(bin, "sentinel.conf", "--sentinel")
		}
		p.URL = fmt.Sprintf("redis://%s/0", p.addr())
		p.ready = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := RedisDo(ctx, fmt.Sprintf("redis://%s", p.addr()), "PING")
			return err
		}
		if err := p.launch(); err != nil {
			s.Close()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, p)
		hosts = append(hosts, p.addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, p := range s.Sentinels {
		if err := s.waitSentinel(ctx, p, func() bool {
			r, _ := RedisDo(ctx, "redis://"+p.addr(), "SENTINEL", "REPLICAS", RedisMasterName)
			n, _ := RedisDo(ctx, "redis://"+p.addr(), "SENTINEL", "SENTINELS", RedisMasterName)
			return strings.Contains(r, strconv.Itoa(replica.Port)) && strings.Count("\n"+n+"\n", "\nip\n") >= 2
		}); err != nil {
			s.Close()
			return nil, err
		}
	}
	pw := ""
	if o.Password != "" {
		pw = ":" + o.Password + "@"
	}
	s.URL = fmt.Sprintf("redis+sentinel://%s%s/%s", pw, strings.Join(hosts, ","), RedisMasterName)
	return s, nil
}

// RequireRedisSentinel is [StartRedisSentinel] for t.
func RequireRedisSentinel(t testing.TB, opts ...RedisOptions) *RedisSentinel {
	s, err := StartRedisSentinel(opts...)
	return require(t, s, err, ErrNoRedis)
}

func (s *RedisSentinel) waitSentinel(ctx context.Context, p *proc, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			out, _ := os.ReadFile(filepath.Join(p.Dir, "server.out"))
			return fmt.Errorf("testenv: sentinel at %s not ready in time; its output:\n%s", p.addr(), out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Primary is the server that every Sentinel names as the primary now, or
// nil while they disagree.
func (s *RedisSentinel) Primary(ctx context.Context) *Redis {
	var port string
	for _, p := range s.Sentinels {
		reply, err := RedisDo(ctx, "redis://"+p.addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", RedisMasterName)
		lines := strings.Split(reply, "\n")
		if err != nil || len(lines) != 2 || port != "" && lines[1] != port {
			return nil
		}
		port = lines[1]
	}
	for _, r := range s.Servers {
		if strconv.Itoa(r.Port) == port {
			return r
		}
	}
	return nil
}

// Failover makes the Sentinels promote the replica (SENTINEL FAILOVER, no
// vote needed) and returns once every Sentinel names it the primary and it
// says so itself (role:master).
func (s *RedisSentinel) Failover(ctx context.Context) (*Redis, error) {
	old := s.Primary(ctx)
	if old == nil {
		return nil, errors.New("testenv: sentinel: no agreed primary before the failover")
	}
	if _, err := RedisDo(ctx, "redis://"+s.Sentinels[0].addr(), "SENTINEL", "FAILOVER", RedisMasterName); err != nil {
		return nil, fmt.Errorf("testenv: sentinel failover: %w", err)
	}
	for {
		if p := s.Primary(ctx); p != nil && p != old {
			if info, err := RedisDo(ctx, p.URL, "INFO", "replication"); err == nil && strings.Contains(info, "role:master") {
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("testenv: sentinel failover not done in time: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops every server and Sentinel and removes their directories.
func (s *RedisSentinel) Close() error {
	var errs []error
	for _, p := range s.Sentinels {
		errs = append(errs, p.Close())
	}
	for _, r := range s.Servers {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// Stop stops the Sentinels and the servers (the servers lose their data).
func (s *RedisSentinel) Stop() error {
	return s.each(func(p *proc) error { return p.Stop() })
}

// Start starts the servers and the Sentinels again.
func (s *RedisSentinel) Start() error {
	var errs []error
	for _, r := range s.Servers {
		errs = append(errs, r.Start())
	}
	for _, p := range s.Sentinels {
		errs = append(errs, p.Start())
	}
	return errors.Join(errs...)
}

// Pause freezes the Sentinels and the servers alike (SIGSTOP), so that no
// Sentinel sees the others fall silent; Resume thaws them.
func (s *RedisSentinel) Pause() error {
	return s.each(func(p *proc) error { return p.Pause() })
}

func (s *RedisSentinel) Resume() error {
	return s.each(func(p *proc) error { return p.Resume() })
}

func (s *RedisSentinel) each(f func(*proc) error) error {
	var errs []error
	for _, p := range s.Sentinels {
		errs = append(errs, f(p))
	}
	for _, r := range s.Servers {
		errs = append(errs, f(r.proc))
	}
	return errors.Join(errs...)
}

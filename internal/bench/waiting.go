package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Waiting cost (issue 21): one holder, and waiters withlocks waiting for
// the same NAME, as the pods of a deployment would. The figures are taken
// on the server process over window, once settle has passed since the
// last waiter began to wait: past the first second, in which a waiter
// polls fast on purpose.
const (
	waiters = 30
	window  = 10 * time.Second
	settle  = 3 * time.Second
)

// waitCost is what the server spent over a window: CPU seconds per second
// (1.0 is one core) and operations per second.
type waitCost struct {
	cpu, ops float64
}

// serverMeter reads a server's cumulative CPU time and operation count.
type serverMeter struct {
	pid int
	ops func() (int64, error)
}

// measure returns what the server spent over window.
func (m serverMeter) measure() (waitCost, error) {
	cpu0, err := cpuTime(m.pid)
	if err != nil {
		return waitCost{}, err
	}
	ops0, err := m.ops()
	if err != nil {
		return waitCost{}, err
	}
	start := time.Now()
	time.Sleep(window) // the measurement window itself
	cpu1, err := cpuTime(m.pid)
	if err != nil {
		return waitCost{}, err
	}
	ops1, err := m.ops()
	if err != nil {
		return waitCost{}, err
	}
	took := time.Since(start).Seconds()
	return waitCost{cpu: (cpu1 - cpu0).Seconds() / took, ops: float64(ops1-ops0) / took}, nil
}

// waiting measures the server with the holder alone, then with the
// waiters behind it, and lets them all finish.
func waiting(work, wl, url string, m serverMeter) (alone, crowd waitCost, err error) {
	dir := filepath.Join(work, "waiting")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return alone, crowd, err
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	holder := command([]string{wl, "--db", url, "waiting", "--", "sh", "-c",
		fmt.Sprintf("echo x > %s; while [ ! -f %s ]; do sleep 0.1; done", f("held"), f("done"))})
	if err := holder.Start(); err != nil {
		return alone, crowd, err
	}
	defer func() {
		os.WriteFile(f("done"), []byte("x\n"), 0o644)
		holder.Wait()
	}()
	for !exists(f("held")) {
		time.Sleep(10 * time.Millisecond)
	}
	if alone, err = m.measure(); err != nil {
		return alone, crowd, err
	}

	var procs []*exec.Cmd
	defer func() {
		os.WriteFile(f("done"), []byte("x\n"), 0o644)
		for _, p := range procs {
			p.Wait()
		}
	}()
	for i := range waiters {
		log, err := os.Create(f(fmt.Sprintf("waiter%d.log", i)))
		if err != nil {
			return alone, crowd, err
		}
		p := exec.Command(wl, "-v", "--db", url, "waiting", "--", "true")
		p.Stderr = log
		if err := p.Start(); err != nil {
			log.Close()
			return alone, crowd, err
		}
		log.Close()
		procs = append(procs, p)
	}
	for i := range waiters {
		for {
			b, _ := os.ReadFile(f(fmt.Sprintf("waiter%d.log", i)))
			if strings.Contains(string(b), "held elsewhere; waiting") {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(settle) // past the first second of each wait, by design
	crowd, err = m.measure()
	return alone, crowd, err
}

// cpuTime is a process's user + system CPU time, from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it
	// count from its closing parenthesis. utime and stime are fields 14
	// and 15, in clock ticks.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// mongoOps counts the commands a MongoDB-wire server has answered (its
// serverStatus metrics; the serverStatus commands themselves excluded).
func mongoOps(url string) (func() (int64, error), func(), error) {
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		return nil, nil, err
	}
	count := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var st struct {
			Metrics struct {
				Commands map[string]struct {
					Total int64 `bson:"total"`
				} `bson:"commands"`
			} `bson:"metrics"`
		}
		if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "serverStatus", Value: 1}}).Decode(&st); err != nil {
			return 0, err
		}
		var n int64
		for cmd, m := range st.Metrics.Commands {
			if cmd != "serverStatus" {
				n += m.Total
			}
		}
		return n, nil
	}
	return count, func() { c.Disconnect(context.Background()) }, nil
}

// printWaiting prints the waiting figure's table.
func printWaiting(rows []string) {
	fmt.Printf("\n## Waiting: one holder and %d waiters on one NAME, the server process over %s\n\n", waiters, window)
	fmt.Println("| backend | server CPU, holder alone | server CPU, holder and waiters | operations/s per waiter |")
	fmt.Println("|---|---:|---:|---:|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

func waitingRow(name string, alone, crowd waitCost) string {
	return fmt.Sprintf("| %s | %.1f%% | %.1f%% | %.2f |", name, 100*alone.cpu, 100*crowd.cpu, (crowd.ops-alone.ops)/waiters)
}

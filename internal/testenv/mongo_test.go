package testenv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests talk to the server in the MongoDB wire protocol by hand (one OP_MSG
// per connection, a little BSON), since withlock's go.mod does not have the
// driver; internal/testenv/ferretdb tests FerretDB with the driver.

// elem is a BSON element: values are string, int (int32), float64, bool, []elem
// (document) or []any (array).
type elem struct {
	k string
	v any
}

func bsonAppendDoc(b []byte, doc []elem) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	for _, e := range doc {
		b = bsonAppendValue(b, e.k, e.v)
	}
	b = append(b, 0)
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b
}

func bsonAppendValue(b []byte, key string, v any) []byte {
	cstring := func(b []byte, s string) []byte { return append(append(b, s...), 0) }
	switch v := v.(type) {
	case float64:
		b = cstring(append(b, 0x01), key)
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	case string:
		b = cstring(append(b, 0x02), key)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)+1))
		return cstring(b, v)
	case []elem:
		return bsonAppendDoc(cstring(append(b, 0x03), key), v)
	case []any:
		arr := make([]elem, len(v))
		for i, x := range v {
			arr[i] = elem{strconv.Itoa(i), x}
		}
		return bsonAppendDoc(cstring(append(b, 0x04), key), arr)
	case bool:
		b = cstring(append(b, 0x08), key)
		if v {
			return append(b, 1)
		}
		return append(b, 0)
	case int:
		b = cstring(append(b, 0x10), key)
		return binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
	}
	panic(fmt.Sprintf("bson: unsupported %T", v))
}

// bsonDecode decodes a document into a map (arrays too, keyed "0", "1", ...):
// doubles as float64, int32 and int64 as int64, dates as time.Time.
func bsonDecode(b []byte) (map[string]any, error) {
	if len(b) < 5 || int(binary.LittleEndian.Uint32(b)) != len(b) {
		return nil, errors.New("bson: bad document length")
	}
	m := map[string]any{}
	p := b[4 : len(b)-1]
	for len(p) > 0 {
		typ := p[0]
		i := 1
		for i < len(p) && p[i] != 0 {
			i++
		}
		if i == len(p) {
			return nil, errors.New("bson: bad key")
		}
		key := string(p[1:i])
		p = p[i+1:]
		need := func(n int) error {
			if len(p) < n {
				return errors.New("bson: truncated")
			}
			return nil
		}
		var n int
		switch typ {
		case 0x01, 0x09, 0x11, 0x12: // double, date, timestamp, int64
			n = 8
		case 0x10:
			n = 4
		case 0x08:
			n = 1
		case 0x0A:
			n = 0
		case 0x07:
			n = 12
		case 0x02, 0x03, 0x04, 0x05: // string, document, array, binary
			if err := need(4); err != nil {
				return nil, err
			}
			n = int(binary.LittleEndian.Uint32(p))
			switch typ {
			case 0x02:
				n += 4
			case 0x05:
				n += 5
			}
		default:
			return nil, fmt.Errorf("bson: type 0x%02x of %q not supported", typ, key)
		}
		if err := need(n); err != nil {
			return nil, err
		}
		v := p[:n]
		p = p[n:]
		switch typ {
		case 0x01:
			m[key] = math.Float64frombits(binary.LittleEndian.Uint64(v))
		case 0x02:
			m[key] = string(v[4 : len(v)-1])
		case 0x03, 0x04:
			sub, err := bsonDecode(v)
			if err != nil {
				return nil, err
			}
			m[key] = sub
		case 0x08:
			m[key] = v[0] != 0
		case 0x09:
			m[key] = time.UnixMilli(int64(binary.LittleEndian.Uint64(v)))
		case 0x0A:
			m[key] = nil
		case 0x10:
			m[key] = int64(int32(binary.LittleEndian.Uint32(v)))
		case 0x12:
			m[key] = int64(binary.LittleEndian.Uint64(v))
		default:
			m[key] = v
		}
	}
	return m, nil
}

// mongoCommand runs one command (cmd, with $db added) on a new connection to the
// server of url and returns the reply; a reply without ok: 1 is an error.
func mongoCommand(ctx context.Context, url, db string, cmd ...elem) (map[string]any, error) {
	addr, err := mongoAddr(url)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// OP_MSG: header (length, requestID, responseTo, opCode 2013), flags, one
	// section of kind 0 (the command).
	msg := make([]byte, 16, 256)
	msg = binary.LittleEndian.AppendUint32(msg, 0)
	msg = append(msg, 0)
	msg = bsonAppendDoc(msg, append(cmd, elem{"$db", db}))
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:], 1)
	binary.LittleEndian.PutUint32(msg[12:], 2013)
	if _, err := conn.Write(msg); err != nil {
		return nil, err
	}
	var hdr [16]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:]))
	if n < 21 || n > 48<<20 || binary.LittleEndian.Uint32(hdr[12:]) != 2013 {
		return nil, fmt.Errorf("mongo: unexpected reply header % x", hdr)
	}
	body := make([]byte, n-16)
	if _, err := io.ReadFull(conn, body); err != nil {
		return nil, err
	}
	if body[4] != 0 {
		return nil, fmt.Errorf("mongo: reply section kind %d", body[4])
	}
	reply, err := bsonDecode(body[5:])
	if err != nil {
		return nil, err
	}
	if reply["ok"] != 1.0 {
		return reply, fmt.Errorf("mongo: %s: code %v: %v", cmd[0].k, reply["code"], reply["errmsg"])
	}
	return reply, nil
}

func mongoAddr(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if u.Scheme != "mongodb" {
		return "", fmt.Errorf("not a mongodb:// URL: %s", s)
	}
	return u.Host, nil
}

func mongoOK(t *testing.T, url, db string, cmd ...elem) map[string]any {
	t.Helper()
	reply, err := mongoCommand(ctx(t), url, db, cmd...)
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

func TestStartMongoTwice(t *testing.T) {
	start := time.Now()
	a := RequireMongo(t)
	t.Logf("first server (with the binary found or built): %v", time.Since(start))
	start = time.Now()
	b := RequireMongo(t)
	t.Logf("second server: %v", time.Since(start))
	if a.Port == b.Port || a.Dir == b.Dir {
		t.Fatalf("servers share port or dir: %+v %+v", a, b)
	}
	for _, m := range []*Mongo{a, b} {
		if want := "mongodb://127.0.0.1:" + strconv.Itoa(m.Port) + "/"; m.URL != want {
			t.Errorf("URL = %q, want %q", m.URL, want)
		}
		mongoOK(t, m.URL, "admin", elem{"ping", 1})
	}
	reply := mongoOK(t, a.URL, "admin", elem{"hello", 1})
	if lt, ok := reply["localTime"].(time.Time); !ok || time.Since(lt).Abs() > 5*time.Second {
		t.Errorf("hello localTime = %v", reply["localTime"])
	}
	reply = mongoOK(t, a.URL, "admin", elem{"buildInfo", 1})
	// Embedded FerretDB says "unknown" for its own version.
	t.Logf("buildInfo: version %v, ferretdbVersion %v", reply["version"], reply["ferretdbVersion"])
	if _, ok := reply["ferretdbVersion"]; !ok {
		t.Errorf("buildInfo has no ferretdbVersion: %v", reply)
	}
}

func TestStartMongoParallel(t *testing.T) {
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			m := RequireMongo(t)
			mongoOK(t, m.URL, "withlock", elem{"insert", "locks"}, elem{"documents", []any{[]elem{{"_id", "x"}}}})
		})
	}
}

func TestMongoDuplicateKey(t *testing.T) {
	m := RequireMongo(t)
	insert := []elem{{"insert", "locks"}, {"documents", []any{[]elem{{"_id", "job"}, {"token", "a"}}}}}
	mongoOK(t, m.URL, "withlock", insert...)
	reply := mongoOK(t, m.URL, "withlock", insert...) // ok: 1 with writeErrors
	we, _ := reply["writeErrors"].(map[string]any)
	first, _ := we["0"].(map[string]any)
	if first["code"] != int64(11000) {
		t.Errorf("duplicate _id: reply %v", reply)
	}
}

func TestMongoStopStartKeepsData(t *testing.T) {
	m := RequireMongo(t)
	mongoOK(t, m.URL, "withlock", elem{"insert", "kept"}, elem{"documents", []any{[]elem{{"_id", "x"}, {"v", "here"}}}})
	port := m.Port
	start := time.Now()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop: %v", time.Since(start))
	if _, err := mongoCommand(ctx(t), m.URL, "admin", elem{"ping", 1}); err == nil {
		t.Fatal("ping succeeded on a stopped server")
	}
	start = time.Now()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart: %v", time.Since(start))
	if m.Port != port {
		t.Errorf("port changed from %d to %d", port, m.Port)
	}
	reply := mongoOK(t, m.URL, "withlock", elem{"find", "kept"}, elem{"filter", []elem{{"_id", "x"}}})
	cursor, _ := reply["cursor"].(map[string]any)
	batch, _ := cursor["firstBatch"].(map[string]any)
	doc, _ := batch["0"].(map[string]any)
	if doc["v"] != "here" {
		t.Errorf("after restart: %v", reply)
	}
}

func TestMongoStartPortTaken(t *testing.T) {
	m := RequireMongo(t)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := m.Start(); !errors.Is(err, errPortInUse) {
		t.Fatalf("Start on a taken port: %v", err)
	}
}

func TestMongoPauseResume(t *testing.T) {
	m := RequireMongo(t)
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := mongoCommand(c, m.URL, "admin", elem{"ping", 1}); err == nil {
		t.Error("ping while paused succeeded")
	}
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	mongoOK(t, m.URL, "admin", elem{"ping", 1})
}

func TestMongoCloseRemovesEverything(t *testing.T) {
	for _, before := range []string{"", "stop", "pause"} {
		t.Run("after "+before, func(t *testing.T) {
			m := RequireMongo(t)
			pid := m.proc.pid()
			switch before {
			case "stop":
				if err := m.Stop(); err != nil {
					t.Fatal(err)
				}
			case "pause":
				if err := m.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if err := m.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			checkServerGone(t, m.Dir, pid, m.Port)
		})
	}
}

func TestMongoWatchdogAfterKill(t *testing.T) {
	serverWatchdogAfterKill(t, "TestMongoWatchdogAfterKill", func() (string, int, error) {
		m, err := StartMongo()
		if err != nil {
			return "", 0, err
		}
		return m.Dir, m.proc.pid(), nil
	})
}

func TestMongoMissingPolicy(t *testing.T) {
	serverMissingPolicy(t, "mongo", "run scripts/test-deps")
}

// TestFerretDBBuildOnce builds the server binary in a fresh cache directory from
// two test binaries at once and expects one build, used by both. With Go's build
// cache warm, the build is a link.
func TestFerretDBBuildOnce(t *testing.T) {
	if os.Getenv("TESTENV_BUILD_CHILD") == "1" {
		bin, err := ferretdbBinary()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("bin", bin)
		return
	}
	if testing.Short() {
		t.Skip("builds the FerretDB binary")
	}
	RequireMongo(t) // for the policy, and to warm Go's build cache
	cache := t.TempDir()
	out, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOCACHE: %v", err)
	}
	gocache := strings.TrimSpace(string(out))
	var wg sync.WaitGroup
	outs := make([]string, 2)
	start := time.Now()
	for i := range outs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestFerretDBBuildOnce$", "-test.v")
			// XDG_CACHE_HOME also moves Go's build cache; keep that one.
			cmd.Env = append(os.Environ(), "TESTENV_BUILD_CHILD=1", "XDG_CACHE_HOME="+cache, "GOCACHE="+gocache)
			out, err := cmd.CombinedOutput()
			outs[i] = string(out)
			if err != nil {
				t.Errorf("child: %v\n%s", err, out)
			}
		})
	}
	wg.Wait()
	t.Logf("two concurrent builds into an empty cache: %v", time.Since(start))
	bins, _ := filepath.Glob(filepath.Join(cache, "withlock-testenv", "ferretdb-*"))
	var built []string
	for _, b := range bins {
		if !strings.HasSuffix(b, ".lock") {
			built = append(built, b)
		}
	}
	if len(built) != 1 {
		t.Fatalf("cache holds %q, want one binary", bins)
	}
	for _, out := range outs {
		if !strings.Contains(out, "bin "+built[0]+"\n") {
			t.Errorf("child did not use %s:\n%s", built[0], out)
		}
	}
}

// TestFerretDBKeyMatchesTestDeps checks that scripts/test-deps builds the binary
// where StartMongo looks for it: its ferretdb_key gives ferretdbKey's key.
func TestFerretDBKeyMatchesTestDeps(t *testing.T) {
	src, err := ferretdbDir()
	if err != nil {
		t.Fatal(err)
	}
	want, err := ferretdbKey(src)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(src, "..", "..", "..")
	// Only the script's definitions of fdbdir, fdbflags and ferretdb_key.
	const run = `set -euo pipefail
cd "$1"
eval "$(sed -n -e '/^fdbdir=/p' -e '/^fdbflags=/p' -e '/^ferretdb_key() {/,/^}/p' scripts/test-deps)"
ferretdb_key`
	out, err := exec.Command("bash", "-c", run, "bash", root).CombinedOutput()
	if err != nil {
		t.Fatalf("ferretdb_key in scripts/test-deps: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("scripts/test-deps ferretdb_key = %q, ferretdbKey = %q", got, want)
	}
}

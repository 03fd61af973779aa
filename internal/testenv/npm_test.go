package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// advisoryKey is the key derivation of SPEC §2, as advisory-lock's strToKey does it.
func advisoryKey(name string) (int32, int32) {
	sum := sha256.Sum256([]byte(name))
	return int32(binary.LittleEndian.Uint32(sum[0:4])), int32(binary.LittleEndian.Uint32(sum[4:8]))
}

func TestAdvisoryKeyExample(t *testing.T) {
	if k1, k2 := advisoryKey("test-lock"); k1 != -107789403 || k2 != -1898803861 {
		t.Errorf("test-lock -> (%d, %d), want (-107789403, -1898803861)", k1, k2)
	}
}

var keyNames = []string{"test-lock", "dbmigration", "", "héllo wörld", "日本語", "a/b", strings.Repeat("x", 255)}

// TestAdvisoryKeyMatchesNPM compares advisoryKey with the installed package's
// strToKey.
func TestAdvisoryKeyMatchesNPM(t *testing.T) {
	dir := RequireNPM(t)
	names, _ := json.Marshal(keyNames)
	cmd := exec.Command("node", "-e", `const {strToKey} = require("advisory-lock");
		for (const n of JSON.parse(process.argv[1])) console.log(strToKey(n).join(" "));`, string(names))
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, name := range keyNames {
		k1, k2 := advisoryKey(name)
		if want := fmt.Sprintf("%d %d", k1, k2); i >= len(lines) || lines[i] != want {
			t.Errorf("%q: advisory-lock says %q, Go says %q", name, lines[i:min(i+1, len(lines))], want)
		}
	}
}

func waitFile(t *testing.T, name string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(name)
		if err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func holdJS(t *testing.T, dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("node", append([]string{filepath.Join(dir, "hold.js")}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

func tryJS(t *testing.T, dir, url, name string) string {
	t.Helper()
	out, err := holdJS(t, dir, "--try", url, name).Output()
	if err != nil {
		t.Fatalf("hold.js --try: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func tryPG(t *testing.T, url, name string) string {
	t.Helper()
	k1, k2 := advisoryKey(name)
	// The connection closes right after, which releases a lock it got.
	rows := execOK(t, url, fmt.Sprintf("select pg_try_advisory_lock(%d, %d)", k1, k2))
	return strings.Join(rows, "|")
}

// TestHoldJS checks hold.js, and that advisory-lock takes the two-int4 lock of
// SPEC §2: while hold.js holds "test-lock", pg_try_advisory_lock(-107789403,
// -1898803861) fails.
func TestHoldJS(t *testing.T) {
	dir := RequireNPM(t)
	p := RequirePostgres(t)
	ready := filepath.Join(t.TempDir(), "ready")
	holder := holdJS(t, dir, p.URL, "test-lock", ready)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	if got := waitFile(t, ready); got != "acquired\n" {
		t.Fatalf("ready file = %q", got)
	}
	if got := tryPG(t, p.URL, "test-lock"); got != "f" {
		t.Errorf("pg_try_advisory_lock while hold.js holds = %q, want f", got)
	}
	if got := execOK(t, p.URL, "select classid::int8 - 4294967296, objid::int8 - 4294967296, objsubid from pg_locks where locktype = 'advisory'"); strings.Join(got, "|") != "-107789403 -1898803861 2" {
		t.Errorf("pg_locks = %q", got)
	}
	if got := tryJS(t, dir, p.URL, "test-lock"); got != "held" {
		t.Errorf("hold.js --try while held = %q", got)
	}
	if got := tryJS(t, dir, p.URL, "other-lock"); got != "acquired" {
		t.Errorf("hold.js --try other-lock = %q", got)
	}
	ready2 := filepath.Join(t.TempDir(), "ready")
	if err := holdJS(t, dir, p.URL, "test-lock", ready2).Run(); err != nil {
		t.Errorf("second hold.js: %v", err)
	}
	if got := waitFile(t, ready2); got != "held\n" {
		t.Errorf("second hold.js ready file = %q", got)
	}

	stdin.Close()
	if err := holder.Wait(); err != nil {
		t.Fatalf("hold.js after stdin closed: %v", err)
	}
	if got := tryJS(t, dir, p.URL, "test-lock"); got != "acquired" {
		t.Errorf("hold.js --try after release = %q", got)
	}
	if got := tryPG(t, p.URL, "test-lock"); got != "t" {
		t.Errorf("pg_try_advisory_lock after release = %q, want t", got)
	}
}

func TestHoldJSSigterm(t *testing.T) {
	dir := RequireNPM(t)
	p := RequirePostgres(t)
	ready := filepath.Join(t.TempDir(), "ready")
	holder := holdJS(t, dir, "--no-stdin", p.URL, "sig-lock", ready) // stdin is /dev/null
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	if got := waitFile(t, ready); got != "acquired\n" {
		t.Fatalf("ready file = %q", got)
	}
	time.Sleep(100 * time.Millisecond) // stdin's EOF must not release it
	if got := tryPG(t, p.URL, "sig-lock"); got != "f" {
		t.Errorf("pg_try_advisory_lock while held = %q, want f", got)
	}
	holder.Process.Signal(syscall.SIGTERM)
	if err := holder.Wait(); err != nil {
		t.Fatalf("hold.js after SIGTERM: %v", err)
	}
	if got := tryPG(t, p.URL, "sig-lock"); got != "t" {
		t.Errorf("pg_try_advisory_lock after SIGTERM = %q, want t", got)
	}
}

func TestHoldJSBadPassword(t *testing.T) {
	dir := RequireNPM(t)
	p := RequirePostgres(t)
	bad := strings.Replace(p.URL, ":"+PostgresPassword+"@", ":nope@", 1)
	var stderr bytes.Buffer
	cmd := holdJS(t, dir, "--try", bad, "x")
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 || !strings.Contains(stderr.String(), "password authentication failed") {
		t.Errorf("bad password: %v, stderr %q", err, stderr.String())
	}
}

// TestAdvisoryLockCLIWaits documents the npm package's own withlock: it waits
// (pg_advisory_lock) for a lock held elsewhere, then runs the command and exits
// with its status.
func TestAdvisoryLockCLIWaits(t *testing.T) {
	dir := RequireNPM(t)
	p := RequirePostgres(t)
	conn, err := pgx.Connect(ctx(t), p.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx(t))
	k1, k2 := advisoryKey("cli-lock")
	if _, err := conn.Exec(ctx(t), "select pg_advisory_lock($1, $2)", k1, k2); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(dir, "node_modules", ".bin", "withlock"), "cli-lock", "--db", p.URL, "--", "sh", "-c", "exit 7")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("npm withlock finished while the lock was held: %v %s", err, out.String())
	case <-time.After(time.Second):
	}
	if _, err := conn.Exec(ctx(t), "select pg_advisory_unlock($1, $2)", k1, k2); err != nil {
		t.Fatal(err)
	}
	var exitErr *exec.ExitError
	if err := <-done; !errors.As(err, &exitErr) || exitErr.ExitCode() != 7 {
		t.Errorf("npm withlock: %v, want exit 7; output %q", err, out.String())
	}
	if !strings.HasPrefix(out.String(), "Lock acquired\n") {
		t.Errorf("npm withlock output %q", out.String())
	}
}

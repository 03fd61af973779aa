package file

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// TestFileSystemFinding: a lock directory on a network file system fails
// the check (no NFS server can be built here, so the classification by
// statfs's f_type is tested alone), unless the user says its locks are
// shared; a local one is fine.
func TestFileSystemFinding(t *testing.T) {
	for _, c := range []struct {
		fsType   int64
		sharedFS bool
		want     lock.Status
		says     string
	}{
		{0xef53, false, lock.Ok, "local file system"},     // ext4
		{0x01021994, false, lock.Ok, "local file system"}, // tmpfs
		{0x9123683e, false, lock.Ok, "local file system"}, // btrfs
		{0x6969, false, lock.Fail, "(NFS)"},
		{0x6969, true, lock.Warn, "--fs-shares-locks says"},
		{0xff534d42, false, lock.Fail, "(CIFS)"},
		{0xfe534d42, false, lock.Fail, "(SMB2)"},
		{0x65735546, false, lock.Fail, "(FUSE)"},
		{0x01021997, false, lock.Fail, "(9P)"},
	} {
		f := fileSystemFinding("/locks", c.fsType, c.sharedFS)
		if f.Status != c.want || !strings.Contains(f.Detail, c.says) {
			t.Errorf("type %#x, shared %v: %s %s; want %s, saying %q", c.fsType, c.sharedFS, f.Status, f.Detail, c.want, c.says)
		}
		if f.Status == lock.Fail && !strings.Contains(f.Fix, "--fs-shares-locks") {
			t.Errorf("type %#x: the fix does not name the flag: %s", c.fsType, f.Fix)
		}
	}
}

// TestCheck: withlock check on a local directory passes, in every mode,
// and leaves no file behind.
func TestCheck(t *testing.T) {
	for _, opts := range []lock.Options{{}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 2}} {
		dir := t.TempDir()
		c := locktest.Open(t, "file://"+dir, opts)
		findings, err := c.Check(locktest.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(findings) != 2 || findings[0].Status != lock.Ok || findings[1].Name != "file system" || findings[1].Status != lock.Ok {
			t.Errorf("%s: %+v; want the probe lock and the file system, both ok", opts.Mode, findings)
		}
		left, _ := filepath.Glob(filepath.Join(dir, "*"))
		if len(left) != 0 {
			t.Errorf("%s: left behind %v", opts.Mode, left)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Error(err)
		}
	}
}

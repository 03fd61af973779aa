package file

import (
	"context"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/withlock/withlock/internal/lock"
)

// Findings reports the file system DIR is on (withlock check), and removes
// the probe lock's file: a lock file is normally kept, since removing it
// while another process opens it would split the lock in two, but the
// probe's name is its alone.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	f := FileName(probe)
	if entries, err := os.ReadDir(b.dir); err == nil {
		for _, e := range entries {
			if isFileOf(e.Name(), f) {
				os.Remove(b.path(e.Name()))
			}
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(b.dir, &st); err != nil {
		return []lock.Finding{{Name: "file system", Status: lock.Warn, Detail: fmt.Sprintf("cannot tell what file system %s is on: %v", b.dir, err)}}, nil
	}
	return []lock.Finding{fileSystemFinding(b.dir, int64(st.Type), b.opts.SharedFS)}, nil
}

// networkFS names the file systems that other hosts can mount too, by
// statfs(2)'s f_type. A flock(2) there may be local to the host (NFS
// mounted with local_lock, a FUSE file system that keeps locks to itself),
// and the file backend's status and release --force see only this host's
// holders (/proc/locks) in any case.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x65735546: "fuse",
	0x01021997: "9p",
	0x00c36400: "ceph",
	0x5346414f: "afs",
	0x6b414653: "afs",
	0x0bd00bd0: "lustre",
	0x01161970: "gfs2",
	0x7461636f: "ocfs2",
	0x47504653: "gpfs",
	0x73757245: "coda",
	0x564c:     "ncp",
}

// fileSystemFinding judges a lock directory dir on a file system of type
// fsType (statfs's f_type): fail on a network file system, unless the user
// says with sharedFS that its locks are shared between every host that
// uses it.
func fileSystemFinding(dir string, fsType int64, sharedFS bool) lock.Finding {
	kind, network := networkFS[fsType]
	switch {
	case !network:
		return lock.Finding{Name: "file system", Status: lock.Ok, Detail: fmt.Sprintf("%s is on a local file system (type %#x): a file:// lock excludes every process on this host", dir, fsType)}
	case sharedFS:
		return lock.Finding{Name: "file system", Status: lock.Warn,
			Detail: fmt.Sprintf("%s is on a network file system (%s); --fs-shares-locks says its locks are shared between hosts, which withlock cannot verify, and status and release --force see only this host's holders", dir, kind)}
	}
	return lock.Finding{Name: "file system", Status: lock.Fail,
		Detail: fmt.Sprintf("%s is on a network file system (%s), where a file lock may be local to each host (NFS mounted with local_lock or nolock, many FUSE file systems): a lock there may exclude nobody on the other hosts", dir, strings.ToUpper(kind)),
		Fix:    "use a server backend (postgres://, redis://, etcd://, ...) for locks across hosts; if every host's locks meet on this file system, pass --fs-shares-locks"}
}

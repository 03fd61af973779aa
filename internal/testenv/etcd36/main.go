// Command etcd36 is etcd 3.6's server, built from the Go module proxy
// for withlock's tests (testenv.StartEtcd with EtcdOptions.Version
// "3.6"), beside the etcd of the system's package. It is a separate
// module so that the server's dependencies stay out of withlock's go.mod.
// It takes etcd's own flags.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

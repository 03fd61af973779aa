// Command withlock runs one command under a named lock held in a shared
// database, so that at most one copy of it runs at a time anywhere.
package main

import (
	"os"

	"github.com/withlock/withlock/cmd"
)

func main() {
	os.Exit(cmd.Main())
}

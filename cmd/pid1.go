package cmd

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// stopSignals end withlock when nothing else is done with them.
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// forwarding is true while runLocked handles the stop signals itself
// (ending a wait, forwarding them to the command).
var forwarding atomic.Bool

// catchStopsAsPID1 makes a stop signal end withlock with 128+signal, as it
// would anywhere else, when withlock is PID 1 (a container's entrypoint)
// and runLocked is not handling it: the kernel ignores a signal whose
// action is the default for PID 1, and Go's runtime, whose own handler
// re-raises it so, then exits 2. Elsewhere the default action stands.
func catchStopsAsPID1() {
	if os.Getpid() != 1 {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	go func() {
		for sig := range sigs {
			if !forwarding.Load() {
				os.Exit(128 + int(sig.(syscall.Signal)))
			}
		}
	}()
}

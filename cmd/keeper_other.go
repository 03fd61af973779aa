//go:build !linux

package cmd

import "syscall"

// processStart is unknown here: the pid alone names the keeper.
func processStart(int) (uint64, bool) { return 0, false }

// keeperAttr starts the keeper in a session of its own.
func keeperAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// closeInheritedOnExec is done where /proc lists the descriptors.
func closeInheritedOnExec() {}

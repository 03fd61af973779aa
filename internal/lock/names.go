package lock

import "unicode/utf8"

// MaxNameLen is the longest lock name, in bytes.
const MaxNameLen = 255

// CheckName reports whether name can be a lock name: non-empty UTF-8 of at
// most MaxNameLen bytes. The error wraps ErrUsage.
func CheckName(name string) error {
	switch {
	case name == "":
		return Errorf(ErrUsage, "the lock name is empty")
	case len(name) > MaxNameLen:
		return Errorf(ErrUsage, "the lock name is %d bytes long; at most %d", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return Errorf(ErrUsage, "the lock name is not valid UTF-8")
	}
	return nil
}

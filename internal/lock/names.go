package lock

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

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

// maxEscaped is the longest escaped name; longer ones are hashed, which
// keeps a file name under NAME_MAX (255) with room for a suffix.
const maxEscaped = 200

// EscapeName is name as a file name or an object key: every byte outside
// [A-Za-z0-9._-], and a leading dot, becomes %XX, so that it cannot leave
// a directory or a key prefix, collide with another name or hide from ls;
// an escaped form longer than 200 bytes becomes sha256-<hex of name>.
func EscapeName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' && i > 0 || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if b.Len() > maxEscaped {
		sum := sha256.Sum256([]byte(name))
		return "sha256-" + hex.EncodeToString(sum[:])
	}
	return b.String()
}

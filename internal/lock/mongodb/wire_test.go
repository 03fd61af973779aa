package mongodb_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

// startProxy starts a fault proxy to target (host:port), stopped when t
// ends, that cuts what clients send into wire-protocol messages named by
// their command ("hello", "isMaster", "saslStart", "find", "insert", ...),
// for a rule to hold or cut the connection at.
func startProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(func() faultproxy.Split { return split })
	return p
}

// split reads one message and names its command.
func split(r *bufio.Reader) (string, []byte, error) {
	msg, err := readMessage(r)
	if err != nil {
		return "", msg, err
	}
	return command(msg), msg, nil
}

// readMessage reads one wire-protocol message: a little-endian int32 length
// that counts itself, then the rest.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:]))
	if n < 16 || n > 48<<20 {
		return nil, errors.New("proxy: bad message length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// command returns the name of the command a message carries: the first key
// of an OP_MSG's body or an OP_QUERY's query; "" if it cannot tell.
func command(msg []byte) string {
	opCode := binary.LittleEndian.Uint32(msg[12:16])
	body := msg[16:]
	var doc []byte
	switch opCode {
	case 2013: // OP_MSG: flags, then a kind 0 section with the command
		if len(body) < 5 || body[4] != 0 {
			return ""
		}
		doc = body[5:]
	case 2004: // OP_QUERY: flags, collection name, skip, return, query
		if len(body) < 4 {
			return ""
		}
		i := 4
		for i < len(body) && body[i] != 0 {
			i++
		}
		i += 1 + 8
		if i >= len(body) {
			return ""
		}
		doc = body[i:]
	default:
		return ""
	}
	// A document: int32 length, then elements: a type byte, a NUL-ended key.
	if len(doc) < 6 {
		return ""
	}
	for i := 5; i < len(doc); i++ {
		if doc[i] == 0 {
			return string(doc[5:i])
		}
	}
	return ""
}

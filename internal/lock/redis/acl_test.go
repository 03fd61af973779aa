package redis

import (
	"strconv"
	"strings"
	"testing"
)

// TestACLRefusal: every form of ACL refusal that Redis 7.0 and 7.2 send for
// withlock's commands is told as what was refused and the rule allowing it.
func TestACLRefusal(t *testing.T) {
	keys := []string{Key("job"), FenceKey("job"), FreshKey, WriterKey("job")}
	line := func(s *luaScript, cmd string) int {
		for i, l := range strings.Split(s.src, "\n") {
			if strings.Contains(l, "redis.call('"+cmd) {
				return i + 1
			}
		}
		t.Fatalf("no %s in the %s script", cmd, s.name)
		return 0
	}
	at := func(s *luaScript, cmd string) string {
		return " script: 0123, on @user_script:" + strconv.Itoa(line(s, cmd)) + "."
	}
	for _, c := range []struct {
		msg  string
		s    *luaScript
		keys []string
		want string
	}{
		{"ERR The user executing the script can't run this command or subcommand" + at(acquireScript, "TIME"), acquireScript, keys,
			"the user may not run TIME (in the acquire script); allow it with the ACL rule +time"},
		{"ERR ACL failure in script: User u has no permissions to run the 'info' command" + at(renewScript, "INFO"), renewScript, keys[:1],
			"the user may not run INFO (in the renew script); allow it with the ACL rule +info"},
		{"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments" + at(acquireScript, "SET', KEYS[2], num"), acquireScript, keys,
			"the user may not access the key withlock-fence:{job} (SET in the acquire script); allow it with the ACL rule ~withlock-*"},
		{"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments" + at(renewScript, "HGET', lock"), renewScript, keys[:1],
			"the user may not access the key withlock:{job} (HGET in the renew script); allow it with the ACL rule ~withlock:*"},
		{"ERR ACL failure in script: User u has no permissions to access the 'withlock-writer:{job}' key" + at(acquireScript, "PTTL"), acquireScript, keys,
			"the user may not access the key withlock-writer:{job} (PTTL in the acquire script); allow it with the ACL rule ~withlock-*"},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", acquireScript, keys,
			"the user may not access one of the keys withlock:{job} withlock-fence:{job} withlock-fresh withlock-writer:{job}; allow them with the ACL rules ~withlock:* ~withlock-*"},
		{"NOPERM this user has no permissions to run the 'evalsha' command", acquireScript, keys,
			"the user may not run EVALSHA; allow it with the ACL rule +evalsha"},
		{"NOPERM User u has no permissions to run the 'multi' command", nil, keys[:1],
			"the user may not run MULTI; allow it with the ACL rule +multi"},
		{"NOPERM this user has no permissions to access one of the channels used as arguments", nil, []string{Channel("job")},
			"the user may not use the channel withlock:released:{job}; allow it with the ACL rule &withlock:released:*"},
		{"NOPERM User u has no permissions to access the 'withlock:released:{job}' channel", nil, []string{Channel("job")},
			"the user may not use the channel withlock:released:{job}; allow it with the ACL rule &withlock:released:*"},
		{"WRONGPASS invalid username-password pair or user is disabled.", nil, nil, ""},
		{"OOM command not allowed when used memory > 'maxmemory'.", renewScript, keys[:1], ""},
	} {
		if got := aclRefusal(c.msg, c.s, c.keys); got != c.want {
			t.Errorf("aclRefusal(%q)\n got %q\nwant %q", c.msg, got, c.want)
		}
	}
}

package redis

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Redis says that an ACL refused a command, but before 7.2 not what it
// refused inside a script ("can't run this command or subcommand"), only
// where: the line of the script. aclRefusal finds the command on that line
// of withlock's own script, so that the message names it and the rule that
// allows it.

// aclPatterns are the patterns aclRefusal reads refusals with, compiled
// at the first refusal rather than in package init, which every withlock
// start runs, whatever the backend.
var aclPatterns = sync.OnceValue(func() *aclRegexps {
	return &aclRegexps{
		quotedCommand: regexp.MustCompile(`permissions to run the '([^']+)' command`),
		quotedKey:     regexp.MustCompile(`permissions to access the '([^']+)' key`),
		quotedChannel: regexp.MustCompile(`permissions to access the '([^']+)' channel`),
		scriptLine:    regexp.MustCompile(`@user_script:(\d+)`),
		luaCall:       regexp.MustCompile(`redis\.p?call\('(\w+)'(?:,\s*([\w\[\]]+))?`),
		luaKey:        regexp.MustCompile(`^KEYS\[(\d)\]$`),
	}
})

type aclRegexps struct {
	// Redis 7.2 and later name what they refused.
	quotedCommand, quotedKey, quotedChannel *regexp.Regexp
	scriptLine                              *regexp.Regexp
	// luaCall is a command in a script's line and its first argument.
	luaCall, luaKey *regexp.Regexp
}

// aclRefusal explains msg, an error reply to s run with keys (s nil: to
// another command, with keys as its keys): what the user's ACL refused and
// which rule allows it. It returns "" when msg is no ACL refusal.
func aclRefusal(msg string, s *luaScript, keys []string) string {
	if !strings.HasPrefix(msg, "NOPERM") && !strings.Contains(msg, "user executing the script can't") && !strings.Contains(msg, "ACL failure in script") {
		return ""
	}
	re := aclPatterns()
	var cmd, arg string
	if s != nil {
		if m := re.scriptLine.FindStringSubmatch(msg); m != nil {
			n, _ := strconv.Atoi(m[1])
			if lines := strings.Split(s.src, "\n"); n >= 1 && n <= len(lines) {
				if c := re.luaCall.FindStringSubmatch(lines[n-1]); c != nil {
					cmd, arg = c[1], scriptKey(c[2], keys)
				}
			}
		}
	}
	in, by := "", "" // where in the script: for a command, for a key
	if s != nil && cmd != "" {
		in, by = fmt.Sprintf(" (in the %s script)", s.name), fmt.Sprintf(" (%s in the %s script)", cmd, s.name)
	}
	switch {
	case re.quotedKey.MatchString(msg):
		return keyRule(re.quotedKey.FindStringSubmatch(msg)[1], by)
	case re.quotedChannel.MatchString(msg):
		return channelRule(re.quotedChannel.FindStringSubmatch(msg)[1])
	case re.quotedCommand.MatchString(msg):
		return commandRule(re.quotedCommand.FindStringSubmatch(msg)[1], in)
	case strings.Contains(msg, "channel"):
		for _, k := range append([]string{arg}, keys...) {
			if strings.HasPrefix(k, "withlock:released:") {
				return channelRule(k)
			}
		}
		return channelRule(Channel("NAME"))
	case strings.Contains(msg, "keys"):
		if arg != "" {
			return keyRule(arg, by)
		}
		return fmt.Sprintf("the user may not access one of the keys %s; allow them with the ACL rules ~withlock:* ~withlock-*", strings.Join(keys, " "))
	case strings.Contains(msg, "command") && cmd != "":
		return commandRule(cmd, in)
	}
	return ""
}

// scriptKey is the key that expr, a command's first argument in a script,
// names: KEYS[i], or the lock (the first key), which the scripts call lock
// or key. It is "" for anything else.
func scriptKey(expr string, keys []string) string {
	if m := aclPatterns().luaKey.FindStringSubmatch(expr); m != nil {
		if i, _ := strconv.Atoi(m[1]); i >= 1 && i <= len(keys) {
			return keys[i-1]
		}
	}
	if (expr == "lock" || expr == "key") && len(keys) > 0 {
		return keys[0]
	}
	return ""
}

func keyRule(key, in string) string {
	rule := "~withlock-*"
	if strings.HasPrefix(key, "withlock:") {
		rule = "~withlock:*"
	}
	return fmt.Sprintf("the user may not access the key %s%s; allow it with the ACL rule %s", key, in, rule)
}

func channelRule(channel string) string {
	return fmt.Sprintf("the user may not use the channel %s; allow it with the ACL rule &withlock:released:*", channel)
}

func commandRule(cmd, in string) string {
	cmd = strings.ToLower(cmd)
	return fmt.Sprintf("the user may not run %s%s; allow it with the ACL rule +%s", strings.ToUpper(cmd), in, cmd)
}

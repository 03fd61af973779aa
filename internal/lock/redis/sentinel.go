package redis

import (
	"net"
	"net/url"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

// A Sentinel-managed primary is given as
// redis+sentinel://[user:pass@]host:port[,host:port...]/MASTER[?db=N]: the
// Sentinels to ask, and the name they know the primary by. go-redis's
// failover client asks them for the primary's address, and follows a
// failover (+switch-master) to the new one. The user and password are the
// primary's (and its replicas'); sentinel_password (and sentinel_user)
// are the Sentinels' own, when they have one.
//
// A replica found where the primary was (the Sentinels have not told the
// client of a failover yet, or one is under way) is an outage to wait out,
// not a refusal: the Sentinels will name a primary again.

// sentinelOptions are the failover client's options of the URL u, with
// the rest of its query (withlock's own options removed) in q.
func sentinelOptions(u *url.URL, q url.Values) (*goredis.FailoverOptions, error) {
	master := strings.Trim(u.Path, "/")
	if master == "" || strings.Contains(master, "/") {
		return nil, lock.Errorf(lock.ErrUsage, "redis+sentinel URL: name the primary as the Sentinels know it: redis+sentinel://host:26379[,host:26379...]/MASTER")
	}
	o := &goredis.FailoverOptions{MasterName: master}
	for _, hp := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(hp, "26379")
		}
		if strings.HasPrefix(hp, ":") {
			return nil, lock.Errorf(lock.ErrUsage, "redis+sentinel URL: a Sentinel without a host: %q", hp)
		}
		o.SentinelAddrs = append(o.SentinelAddrs, hp)
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	for k, v := range q {
		switch k {
		case "db":
			n, err := strconv.Atoi(v[0])
			if err != nil || n < 0 {
				return nil, lock.Errorf(lock.ErrUsage, "redis+sentinel URL: db must be a database number, not %q", v[0])
			}
			o.DB = n
		case "sentinel_user":
			o.SentinelUsername = v[0]
		case "sentinel_password":
			o.SentinelPassword = v[0]
		default:
			return nil, lock.Errorf(lock.ErrUsage, "redis+sentinel URL: unknown option %s (known: db, sentinel_user, sentinel_password, wait_replicas)", k)
		}
	}
	return o, nil
}

// failoverOptions fills o with the connection settings of every withlock
// client (see open).
func failoverOptions(o *goredis.FailoverOptions, r *goredis.Options) *goredis.FailoverOptions {
	o.Dialer, o.DialTimeout, o.DialerRetries = r.Dialer, r.DialTimeout, r.DialerRetries
	o.ContextTimeoutEnabled, o.MaxRetries, o.PoolSize = r.ContextTimeoutEnabled, r.MaxRetries, r.PoolSize
	o.ClientName, o.DisableIdentity = r.ClientName, r.DisableIdentity
	return o
}

package lock

import (
	"net/url"
	"sort"
	"strings"
	"sync"
)

// Opener opens a Backend for a URL and Options (already defaulted by Open).
// It must not touch the network.
type Opener func(u *url.URL, opts Options) (Backend, error)

var (
	registryMu sync.Mutex
	registry   = map[string]Opener{}
)

// Register makes a backend available under URL scheme (lower case). It
// panics if open is nil or the scheme is registered twice, since either is
// a programming error.
func Register(scheme string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if open == nil {
		panic("lock: Register called with a nil Opener for scheme " + scheme)
	}
	if _, dup := registry[scheme]; dup {
		panic("lock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	var s []string
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Open returns a Client for rawURL and opts (zero values meaning the
// defaults). It does not connect. Errors wrap ErrUsage (malformed URL,
// unknown scheme, options the backend cannot honour).
func Open(rawURL string, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	if err := opts.check(); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		// Not shown: where a password stands in it cannot be known.
		if unencodedUserinfo(rawURL) {
			return nil, Errorf(ErrUsage, "the backend URL is not a URL: its user or password has a character that must be percent-encoded: / as %%2F, # as %%23, ? as %%3F, %% as %%25 (and : in the user as %%3A)")
		}
		return nil, Errorf(ErrUsage, "the backend URL is not a URL of the form scheme://...; %s", schemesHint())
	}
	scheme := strings.ToLower(u.Scheme)
	registryMu.Lock()
	open := registry[scheme]
	registryMu.Unlock()
	if open == nil {
		return nil, Errorf(ErrUsage, "unknown scheme %q; %s", u.Scheme, schemesHint())
	}
	b, err := open(u, opts)
	if err != nil {
		return nil, err
	}
	return &Client{Backend: b, opts: opts}, nil
}

// unencodedUserinfo reports whether raw, a URL that does not parse, looks
// like scheme://USER:PASSWORD@HOST... with a "/", "#" or "?" in USER or
// PASSWORD, which end the host part where they stand: an "@" after one of
// them, before the first "/" that follows it.
func unencodedUserinfo(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/#?")
	return i >= 0 && strings.Contains(rest[i:], "@")
}

func schemesHint() string {
	var s []string
	for _, k := range Schemes() {
		s = append(s, k+"://")
	}
	return "supported: " + strings.Join(s, ", ")
}

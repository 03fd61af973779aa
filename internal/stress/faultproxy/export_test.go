package faultproxy

// Links is how many connections p holds, dialled or waiting to be: what
// the tests (package faultproxy_test, which imports testenv, itself an
// importer of this package) wait for.
func Links(p *Proxy) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

package bulwark

import (
	"context"
	"errors"
	"net"
	"sort"
)

// ErrNoEndpoints reports that a balanced upstream had no instance to send
// to: its Resolver has never returned a usable set. A *NoEndpointsError
// matches it.
var ErrNoEndpoints = errors.New("bulwark: no endpoints")

// NoEndpointsError reports a request to a balanced upstream that was not
// sent because no instance was known. Err is the Resolver's error.
type NoEndpointsError struct {
	Host string // the logical "host:port"
	Err  error  // the resolver's error, or nil when it returned no address
}

func (e *NoEndpointsError) Error() string {
	if e.Err == nil {
		return "bulwark: no endpoints for " + e.Host + ": resolver returned none"
	}
	return "bulwark: no endpoints for " + e.Host + ": " + e.Err.Error()
}

// Unwrap returns ErrNoEndpoints and the resolver's error.
func (e *NoEndpointsError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNoEndpoints}
	}
	return []error{ErrNoEndpoints, e.Err}
}

// Resolver finds the instances of a logical upstream. Resolve is called
// with the logical "host:port" of the requests (for example
// "tax.internal:443") and returns the instances as "host:port" strings.
// bulwark calls it once before the first request to the upstream, then
// again every Endpoints.ResolveEvery, in the background; a failed or empty
// answer keeps the last good set. It must be safe for concurrent use and
// should return promptly when ctx ends.
type Resolver interface {
	Resolve(ctx context.Context, name string) ([]string, error)
}

// DNSResolver is the built-in Resolver: it looks the logical host up with
// LookupHost and gives every address the logical port (or Port). Set it as
// Endpoints.Resolver; its zero value uses net.DefaultResolver.
type DNSResolver struct {
	// Resolver does the lookups. Nil means net.DefaultResolver.
	Resolver *net.Resolver
	// Port is the port of every instance. Empty means the port of the
	// logical name (the URL's, or its scheme's default).
	Port string
}

// Resolve looks up name's host and returns its addresses, sorted, each
// joined with the port.
func (d *DNSResolver) Resolve(ctx context.Context, name string) ([]string, error) {
	host, port, err := net.SplitHostPort(name)
	if err != nil {
		return nil, err
	}
	if d.Port != "" {
		port = d.Port
	}
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	sort.Strings(addrs)
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.JoinHostPort(a, port))
	}
	return out, nil
}

package bulwark

import (
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// parseUpstreamKey splits an Upstreams key into the host and port requests
// route by: the host through canonicalHost, the port empty when the key
// has none. It refuses anything that is not exactly "host" or "host:port",
// with a reason that says what to write instead.
//
// An IPv6 address goes in brackets, "[::1]" or "[::1]:443", as in a URL. A
// bare one is refused even without a port: in "2001:db8::1:80" nobody can
// tell whether 80 is the last group of the address or a port, and "::1"
// reads (to url.Parse) as host ":" and port "1". A request URL always
// brackets the address, so the bracketed key is the one it can match.
func parseUpstreamKey(k string) (host, port string, err error) {
	switch {
	case k == "":
		return "", "", errString("empty upstream key")
	case strings.Contains(k, "://"):
		return "", "", errString("upstream key must be host or host:port, without a scheme")
	case strings.ContainsAny(k, "/?#@ \t"):
		return "", "", errString("upstream key must be host or host:port, without path, query, userinfo or spaces")
	}
	split := splitHostKey
	if k[0] == '[' {
		split = splitBracketedKey
	}
	host, rest, err := split(k)
	if err != nil {
		return "", "", err
	}
	if rest != "" {
		if port, err = checkKeyPort(rest[1:]); err != nil {
			return "", "", err
		}
	}
	return canonicalHost(host), port, nil
}

// splitBracketedKey splits "[v6]" or "[v6]:port" into the address and
// ":port" (or "").
func splitBracketedKey(k string) (host, rest string, err error) {
	end := strings.IndexByte(k, ']')
	if end < 0 {
		return "", "", errString("upstream key must be host or host:port")
	}
	host, rest = k[1:end], k[end+1:]
	if a, err := netip.ParseAddr(host); err != nil || !a.Is6() || a.Zone() != "" {
		return "", "", errString("upstream key's brackets hold an IPv6 address, without a zone")
	}
	if rest != "" && rest[0] != ':' {
		return "", "", errString("upstream key must be host or host:port")
	}
	return host, rest, nil
}

// splitHostKey splits "name" or "name:port" into the name and ":port" (or
// "").
func splitHostKey(k string) (host, rest string, err error) {
	host = k
	if i := strings.IndexByte(k, ':'); i >= 0 {
		if strings.IndexByte(k[i+1:], ':') >= 0 {
			return "", "", errString("upstream key looks like a bare IPv6 address: write it in brackets: " +
				strconv.Quote("["+k+"]") + " or " + strconv.Quote("["+k+"]:port"))
		}
		host, rest = k[:i], k[i:]
	}
	if err := checkHostName(host); err != nil {
		return "", "", err
	}
	return host, rest, nil
}

// checkKeyPort refuses a key's port that is not 1..65535 written plainly.
func checkKeyPort(port string) (string, error) {
	switch n, err := strconv.Atoi(port); {
	case port == "":
		return "", errString("upstream key has an empty port")
	case !allDigits(port):
		return "", errString("upstream key must be host or host:port, with a decimal port")
	case err != nil || n < 1 || n > 65535:
		return "", errString("upstream key's port must be 1..65535")
	case port[0] == '0':
		// A request URL's port is matched as written: "080" would
		// never match a request to port 80.
		return "", errString("upstream key's port must be written without leading zeros")
	}
	return port, nil
}

// checkHostName refuses a host that is neither a DNS name nor an IPv4
// address: empty, with an empty label (one trailing dot is allowed, as in
// DNS), or with a character other than a letter, a digit, '-', '_' or a
// dot. Letters and digits beyond ASCII are allowed, so an internationalised
// name may be written as it is spelled in URLs.
func checkHostName(host string) error {
	name := strings.TrimSuffix(host, ".")
	if name == "" {
		return errString("upstream key has no host")
	}
	if !utf8.ValidString(name) {
		return errString("upstream key's host may hold only letters, digits, '-', '_' and dots")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return errString("upstream key's host has an empty label (a leading dot, or two dots in a row)")
		}
		for _, r := range label {
			if !hostNameRune(r) {
				return errString("upstream key's host may hold only letters, digits, '-', '_' and dots")
			}
		}
	}
	return nil
}

// canonicalHost is the spelling of a host that routing compares: lower case
// (DNS names are case-insensitive), without one trailing dot. A fully
// qualified "api.example.com." names the same host as "api.example.com",
// so a request cannot escape that name's policy by adding the dot.
func canonicalHost(host string) string {
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// hostNameRune reports whether r may stand in a host name's label: an ASCII
// letter or digit, '-', '_', or a non-ASCII letter, digit or mark (an IDN
// written in Unicode).
func hostNameRune(r rune) bool {
	switch {
	case r == '-' || r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9':
		return true
	case r < utf8.RuneSelf:
		return false
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}

// Package config reads bulwark's policies from a file, YAML or JSON, and
// keeps a Transport running the file as it changes.
//
// The format maps one to one onto bulwark.Config: every field, under its Go
// name with the leading capital lowered (Retry.MaxAttempts is
// retry.maxAttempts), Upstreams and Routes by their keys, durations as Go
// strings ("150ms"), and the values a file cannot spell, functions and
// interfaces such as Policy.Classify or Fallback.Func, by a name the
// program gives them in a Registry:
//
//	version: "2026-12-03.1"     # optional; else the bytes' SHA-256
//	default:
//	  timeout: {total: 2s, attempt: 1s}
//	upstreams:
//	  tax.internal:
//	    breaker: {slowCall: 100ms, slowCallRate: 0.5, minCalls: 20}
//	    retry: {maxAttempts: 2, base: 10ms, jitter: equal}
//	    fallback: {func: last-rate}   # Registry.Fallbacks["last-rate"]
//
// Parse turns bytes into a validated Config and its version; Load reads a
// file; Marshal writes a Config back; Watch reloads a file into a running
// Transport with Transport.Update, and a file it cannot apply leaves the
// Transport as it was and shows in Snapshot.Config. Schema is the format's
// JSON Schema, for editors. Package redisfleet's ConfigFollower applies a
// configuration pushed to a whole fleet through Redis with Apply.
package config

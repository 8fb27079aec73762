package main

import (
	"context"
	"fmt"
	"strings"
)

// spec is one scenario of the lab: how to run it and how to sum it up.
// Adding a scenario is a new file that defines its spec and one line in
// scenarios below.
type spec struct {
	key   string // the -scenario name
	title string // the heading of its section
	blurb string // one line for -h: what it replays
	run   func(*lab, context.Context) (*scenario, error)
	// verdict is the scenario's key figure, plain against bulwark, in one
	// sentence computed from its runs (without the "Verdict: " prefix).
	verdict func(*scenario) string
}

// scenarios is the lab's registry, in the order "all" runs them.
var scenarios = []spec{
	tuesdaySpec,
	tuesdayGRPCSpec,
	stormSpec,
	deadlinesSpec,
	outlierSpec,
	tailSpec,
	capacitySpec,
	throttleSpec,
	chainSpec,
}

// keys lists the registry's names, for flags and errors.
func keys() string {
	var ks []string
	for _, s := range scenarios {
		ks = append(ks, s.key)
	}
	return strings.Join(ks, ", ")
}

// pick returns the scenarios -scenario names.
func pick(which string) ([]spec, error) {
	if which == "all" {
		return scenarios, nil
	}
	for _, s := range scenarios {
		if s.key == which {
			return []spec{s}, nil
		}
	}
	return nil, fmt.Errorf("-scenario %q: want all, %s", which, keys())
}

// verdictLine is a scenario's verdict as printed: "Verdict: ...".
func verdictLine(sc *scenario) string {
	if sc.verdict == "" {
		return ""
	}
	return "Verdict: " + sc.verdict
}

// fleetPointer says where the fleet's lab is. It is not a scenario here:
// it starts a redis-server and eight processes of its own, which make
// demo should not need.
const fleetPointer = "The fleet: processes that share their breakers' verdicts, a quota (by leases) and a retry budget through Redis (package redisfleet) have a lab of their own, outside this one because it needs redis-server and starts 8 processes: cd redisfleet && go run ./cmd/fleetlab (about two minutes; each process deciding alone against sharing: the calls a failing upstream got before every process stopped calling it, the requests reaching a third party with a 100 req/s quota, and Redis killed for 5 s mid-run)."

package bulwark

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestSnapshotJSON: a Snapshot encodes its breaker states and controls as
// their names, and decodes from its own JSON unchanged; a name it does not
// know is an error, not a zero state.
func TestSnapshotJSON(t *testing.T) {
	for _, st := range []CircuitState{CircuitClosed, CircuitHalfOpen, CircuitOpen} {
		for _, c := range []BreakerControl{BreakerAuto, BreakerForceOpen, BreakerForceClosed} {
			in := Snapshot{Hosts: []HostSnapshot{{Host: "a.test:80", Scheme: "http", Upstream: "default",
				Breaker: &BreakerSnapshot{State: st, Control: c, Calls: 3}}}}
			raw, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`"State":"` + st.String() + `"`, `"Control":"` + c.String() + `"`} {
				if !strings.Contains(string(raw), want) {
					t.Errorf("json.Marshal(%v, %v) = %s, want it to contain %s", st, c, raw, want)
				}
			}
			var out Snapshot
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("json.Unmarshal(%s): %v", raw, err)
			}
			if !reflect.DeepEqual(out, in) {
				t.Errorf("json round trip of %v, %v = %+v, want %+v", st, c, out.Hosts[0].Breaker, in.Hosts[0].Breaker)
			}
		}
	}
	for _, bad := range []string{`{"State":"ajar"}`, `{"Control":"force-half"}`, `{"State":2}`} {
		var b BreakerSnapshot
		if err := json.Unmarshal([]byte(bad), &b); err == nil {
			t.Errorf("json.Unmarshal(%s) = %+v, want an error", bad, b)
		}
	}
}

package bulwark

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestSnapshotConfigVersion follows Snapshot.Config through New, an Update
// that applies, one that is refused and a loader's RejectConfig.
func TestSnapshotConfigVersion(t *testing.T) {
	tr, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := tr.Snapshot().Config; c != nil {
		t.Fatalf("Snapshot().Config = %+v for a Config without Version, want nil", c)
	}
	// A refused Update without a Version or Source is not recorded.
	if err := tr.Update(Config{Default: Policy{Retry: Retry{MaxAttempts: -1}}}); err == nil {
		t.Fatal("Update(MaxAttempts -1) = nil, want an error")
	}
	if c := tr.Snapshot().Config; c != nil {
		t.Fatalf("after an unversioned refusal Snapshot().Config = %+v, want nil", c)
	}

	if err := tr.Update(Config{Version: "v1", Source: "a.yaml"}); err != nil {
		t.Fatal(err)
	}
	c := tr.Snapshot().Config
	if c == nil || c.Version != "v1" || c.Source != "a.yaml" || c.Applied.IsZero() || c.Rejected != nil {
		t.Fatalf("after Update(v1) Snapshot().Config = %+v, want v1 from a.yaml, nothing rejected", c)
	}

	bad := Config{Version: "v2", Source: "a.yaml", Default: Policy{Retry: Retry{MaxAttempts: -1}}}
	uerr := tr.Update(bad)
	var ce *ConfigError
	if !errors.As(uerr, &ce) {
		t.Fatalf("Update(v2) = %v, want a *ConfigError", uerr)
	}
	c = tr.Snapshot().Config
	if c.Version != "v1" || c.Rejected == nil || c.Rejected.Version != "v2" || c.Rejected.Error != uerr.Error() {
		t.Fatalf("after a refused Update(v2) Snapshot().Config = %+v (rejected %+v), want v1 in force, v2 rejected with %q", c, c.Rejected, uerr)
	}

	tr.RejectConfig("v3", "a.yaml", errors.New("a.yaml:3:5: unknown field"))
	c = tr.Snapshot().Config
	if c.Version != "v1" || c.Rejected.Version != "v3" || c.Rejected.Error != "a.yaml:3:5: unknown field" {
		t.Fatalf("after RejectConfig(v3) Snapshot().Config = %+v (rejected %+v), want v1 in force, v3 rejected", c, c.Rejected)
	}

	// The last refusal stays in view after a later version applies, and
	// the whole record survives JSON, as the debug page serves it.
	if err := tr.Update(Config{Version: "v4", Source: "a.yaml"}); err != nil {
		t.Fatal(err)
	}
	s := tr.Snapshot()
	if s.Config.Version != "v4" || s.Config.Rejected.Version != "v3" {
		t.Fatalf("after Update(v4) Snapshot().Config = %+v, want v4 in force, v3 still the last rejected", s.Config)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	br, sr := *back.Config.Rejected, *s.Config.Rejected
	if br.Version != sr.Version || br.Source != sr.Source || br.Error != sr.Error || !br.At.Equal(sr.At) ||
		back.Config.Version != "v4" || !back.Config.Applied.Equal(s.Config.Applied) {
		t.Fatalf("Snapshot.Config through JSON = %+v, want %+v", back.Config, s.Config)
	}
}

package agent

import (
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// TestKeepDrained: only a drain that stays up (nodectl's), once drained,
// leaves the node drained for the agent's next start; SIGTERM's drain
// (systemctl restart: drain, exit, start serving) and a drain still under
// way do not.
func TestKeepDrained(t *testing.T) {
	for _, c := range []struct {
		trigger, phase string
		stay, want     bool
	}{
		{triggerNodectl, controlapi.DrainDrained, true, true},
		{triggerSIGTERM, controlapi.DrainDrained, false, false},
		// A SIGTERM that joined a nodectl drain before it was drained
		// makes it exit: the next start serves.
		{triggerNodectl, controlapi.DrainDrained, false, false},
		{triggerNodectl, controlapi.DrainInFlight, true, false},
		{triggerNodectl, controlapi.DrainUndraining, true, false},
	} {
		if got := keepDrained(controlapi.Drain{Trigger: c.trigger, Phase: c.phase}, c.stay); got != c.want {
			t.Errorf("%s drain, phase %s, stay %v: keep %v, want %v", c.trigger, c.phase, c.stay, got, c.want)
		}
	}
}

// TestDrainedRecord: the drained state survives a reopen of the store,
// with the drain that left it; undrain's clear removes it; an unreadable
// record still says drained.
func TestDrainedRecord(t *testing.T) {
	a := &Agent{opts: Options{DataDir: t.TempDir()}}
	if err := a.openStore(); err != nil {
		t.Fatal(err)
	}
	if _, drained, err := a.loadDrained(); err != nil || drained {
		t.Fatalf("fresh store: drained %v, %v", drained, err)
	}
	at := time.Unix(1_800_000_000, 0).UTC()
	if err := a.saveDrained(controlapi.Drain{Phase: controlapi.DrainDrained, Trigger: triggerNodectl, DrainedAt: at, ForcedEnded: 2}); err != nil {
		t.Fatal(err)
	}
	a.db.Close()
	if err := a.openStore(); err != nil {
		t.Fatal(err)
	}
	defer a.db.Close()
	d, drained, err := a.loadDrained()
	if err != nil || !drained || d.Phase != controlapi.DrainDrained || !d.DrainedAt.Equal(at) || d.ForcedEnded != 2 || d.Trigger != triggerNodectl {
		t.Fatalf("after a reopen: %+v drained %v, %v", d, drained, err)
	}
	if err := a.clearDrained(); err != nil {
		t.Fatal(err)
	}
	if _, drained, err := a.loadDrained(); err != nil || drained {
		t.Fatalf("after undrain: drained %v, %v", drained, err)
	}
	a.db.Update(func(txn *badger.Txn) error { return txn.Set(drainedKey, []byte("{not json")) })
	if d, drained, err := a.loadDrained(); err != nil || !drained || d.Phase != controlapi.DrainDrained {
		t.Fatalf("unreadable record: %+v drained %v, %v", d, drained, err)
	}
}

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// openStore opens the agent's own state: the generations it gave out, the
// workers it runs, which a restarted agent adopts, and whether the node
// is drained.
func (a *Agent) openStore() error {
	dir := filepath.Join(a.opts.DataDir, "agent")
	if err := privateDir(dir); err != nil {
		return fmt.Errorf("agent: state store: %w", err)
	}
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil).
		WithMemTableSize(8 << 20).WithValueLogFileSize(16 << 20).WithBlockCacheSize(4 << 20).WithIndexCacheSize(4 << 20))
	if err != nil {
		return fmt.Errorf("agent: state store: %w", err)
	}
	a.db = db
	return nil
}

// drainedKey holds the drain that left the node drained, while it is: a
// node an operator drained comes back drained after an agent restart (a
// crash, a systemd restart) until `nodectl undrain`.
var drainedKey = []byte("drained")

// keepDrained says whether a drain leaves the node drained for the
// agent's next start: only one that stays up once drained (nodectl's). A
// SIGTERM drain exits and the next start serves again (systemctl restart
// = drain, exit, start); a SIGTERM to a node already drained by nodectl
// leaves the record that drain wrote.
func keepDrained(d controlapi.Drain, stay bool) bool {
	return stay && d.Phase == controlapi.DrainDrained
}

// saveDrained records that the node is drained, by d.
func (a *Agent) saveDrained(d controlapi.Drain) error {
	b, _ := json.Marshal(d)
	if err := a.db.Update(func(txn *badger.Txn) error { return txn.Set(drainedKey, b) }); err != nil {
		return fmt.Errorf("agent: record the drained state: %w", err)
	}
	return nil
}

// clearDrained records that the node is no longer drained.
func (a *Agent) clearDrained() error {
	if err := a.db.Update(func(txn *badger.Txn) error { return txn.Delete(drainedKey) }); err != nil {
		return fmt.Errorf("agent: clear the drained state: %w", err)
	}
	return nil
}

// loadDrained returns the drain that left the node drained, if one did.
// A record that does not decode still says drained: what it held is
// lost, not the operator's intent.
func (a *Agent) loadDrained() (controlapi.Drain, bool, error) {
	var d controlapi.Drain
	err := a.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(drainedKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if json.Unmarshal(v, &d) != nil {
				d = controlapi.Drain{Trigger: triggerNodectl, Detail: "drained state record unreadable"}
			}
			return nil
		})
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return controlapi.Drain{}, false, nil
	case err != nil:
		return controlapi.Drain{}, false, fmt.Errorf("agent: read the drained state: %w", err)
	}
	d.Phase = controlapi.DrainDrained
	return d, true, nil
}

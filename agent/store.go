package agent

import (
	"fmt"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
)

// openStore opens the agent's own state: the generations it gave out and
// the workers it runs, which a restarted agent adopts.
func (a *Agent) openStore() error {
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(a.opts.DataDir, "agent")).WithLogger(nil).
		WithMemTableSize(8 << 20).WithValueLogFileSize(16 << 20).WithBlockCacheSize(4 << 20).WithIndexCacheSize(4 << 20))
	if err != nil {
		return fmt.Errorf("agent: state store: %w", err)
	}
	a.db = db
	return nil
}

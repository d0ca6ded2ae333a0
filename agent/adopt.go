package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/kv"
)

// recordLocked is what to remember of inst's running worker (StartTime is
// the caller's to fill). Agent.mu must be held.
func (inst *instance) recordLocked() workerRecord {
	return workerRecord{InstanceID: inst.id, Generation: inst.gen, KVGeneration: inst.kvGen, PID: inst.pid, Addr: inst.addr,
		Model: inst.model, Revision: inst.revision, Numerics: inst.numerics, KVIdentity: inst.kvIdentity}
}

// workerRecord is what the agent remembers of a running worker, so that a
// restarted agent can adopt it instead of killing it: an agent restart must
// not cut in-flight streams.
type workerRecord struct {
	InstanceID string `json:"instance_id"`
	Generation uint64 `json:"generation"`
	// KVGeneration is the generation the worker started with, under which
	// it writes the KV arena; Generation may have been raised since.
	KVGeneration uint64 `json:"kv_generation"`
	PID          int    `json:"pid"`
	// StartTime is field 22 of /proc/<pid>/stat: with the pid it names one
	// process, never a later one that reused the pid.
	StartTime string `json:"start_time"`
	Addr      string `json:"addr"`
	Model     string `json:"model"`
	Revision  string `json:"model_revision"`
	Numerics  string `json:"numerics_id"`
	// KVIdentity is the worker's block identity (from its Ready line).
	KVIdentity *kv.Identity `json:"kv_identity,omitempty"`
}

func workerKey(instance string) []byte { return []byte("worker/" + instance) }

// processStartTime reads a process's start time in clock ticks since boot.
func processStartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may contain spaces; it ends at the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("agent: malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return "", fmt.Errorf("agent: short /proc/%d/stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return "", fmt.Errorf("agent: process %d is dead", pid)
	}
	return fields[19], nil
}

func (a *Agent) saveWorker(r workerRecord) error {
	b, _ := json.Marshal(r)
	return a.db.Update(func(txn *badger.Txn) error { return txn.Set(workerKey(r.InstanceID), b) })
}

func (a *Agent) forgetWorker(instance string) {
	a.db.Update(func(txn *badger.Txn) error { return txn.Delete(workerKey(instance)) })
}

// adoptable returns the record of a worker of this instance that still
// runs, the very process the agent started (same pid and start time).
func (a *Agent) adoptable(instance string) (*workerRecord, bool) {
	var r workerRecord
	err := a.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(workerKey(instance))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return json.Unmarshal(v, &r) })
	})
	if err != nil || r.PID <= 0 {
		return nil, false
	}
	st, err := processStartTime(r.PID)
	if err != nil || st != r.StartTime {
		return nil, false
	}
	return &r, true
}

package agent

// InstancesPrefix is where ready instances are registered, each under the
// agent's lease.
const InstancesPrefix = "/lifeline/v1/instances/"

// FailuresPrefix is where the agent announces a worker death the moment it
// sees it; frontends watch it to migrate streams without waiting for any
// lease. Entries live under the agent's lease.
const FailuresPrefix = "/lifeline/v1/failures/"

// GenerationsPrefix holds the highest generation given to each instance,
// bumped with a transaction so it is monotonic across restarts and hosts.
const GenerationsPrefix = "/lifeline/v1/generations/"

// Registration is the value of an instance key.
type Registration struct {
	InstanceID    string `json:"instance_id"`
	Generation    uint64 `json:"generation"`
	Node          string `json:"node"`
	Role          string `json:"role"`
	Model         string `json:"model"`
	ModelRevision string `json:"model_revision"`
	NumericsID    string `json:"numerics_id"`
	Addr          string `json:"addr"`
	Ready         bool   `json:"ready"`
	Draining      bool   `json:"draining"`
	Running       int    `json:"running"`
	Queued        int    `json:"queued"`
	FreeBlocks    int    `json:"free_blocks"`
	// KVAddr is the node agent's KV transfer endpoint (QUIC, ALPN
	// lifeline-kv/1): peers fetch published blocks from it and frontends
	// ask it to pull blocks for this instance.
	KVAddr string `json:"kv_addr,omitempty"`
}

// Failure is the value of a failure key.
type Failure struct {
	InstanceID string `json:"instance_id"`
	Generation uint64 `json:"generation"`
	Node       string `json:"node"`
	Reason     string `json:"reason"`
	Detector   string `json:"detector"`
	DetectedAt int64  `json:"detected_at_unix_nano"`
}

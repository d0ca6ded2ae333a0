// Package schema is the etcd schema of a Lifeline cluster: the keys node
// agents write under their leases (instances, nodes, failures,
// generations) and the JSON records stored at them. Agents write it;
// frontends, nodectl, benchmarks and tests read it. It imports nothing of
// the agent, so reading the cluster costs no node machinery.
package schema

import "github.com/lifeline-llm/lifeline/kv/blockid"

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

// NodesPrefix is where each agent describes its node under its lease: the
// KV transfer endpoint and a summary of the node's published prefixes. The
// key outlives the node's workers (their published blocks stay readable
// while the agent lives) and goes with the agent's lease.
const NodesPrefix = "/lifeline/v1/nodes/"

// MaxUnavailableKey holds the cluster's disruption budget: how many nodes
// may be drained at once (a decimal integer; 1 when the key is absent).
const MaxUnavailableKey = "/lifeline/v1/drain/max_unavailable"

// DrainHoldersPrefix holds one key per node that has taken a share of the
// disruption budget (a DrainHolder, under that agent's lease). An agent
// adds its key with a transaction that fails if the holders changed since
// it counted them.
const DrainHoldersPrefix = "/lifeline/v1/drain/holders/"

// DrainHolder is the value of a drain holder key.
type DrainHolder struct {
	Node string `json:"node"`
	// Trigger is what started the drain: "nodectl" or "SIGTERM".
	Trigger       string `json:"trigger"`
	SinceUnixNano int64  `json:"since_unix_nano"`
}

// NodeRecord is the value of a node key.
type NodeRecord struct {
	Node      string `json:"node"`
	KVAddr    string `json:"kv_addr"`
	Transport string `json:"transport"`
	// Prefixes summarises the node's published blocks: the first 8 bytes
	// (hex) of each published key, most recently used first, at most
	// MaxSummaryKeys. A key is a hash of a whole prefix (identity, every
	// token up to the block), so a match is a cached prefix.
	Prefixes []string `json:"prefixes,omitempty"`
	// UpdatedUnixNano is when the summary was taken; routers ignore a
	// summary older than a few seconds.
	UpdatedUnixNano int64 `json:"updated_unix_nano"`
}

// MaxSummaryKeys bounds a node's prefix summary.
const MaxSummaryKeys = 2048

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
	// KVIdentity describes the instance's KV blocks (cache-aware routing).
	KVIdentity *blockid.Identity `json:"kv_identity,omitempty"`
	// ContextLen and TokenizerHash are the worker's (its Ready line):
	// frontends refuse prompts that cannot fit before routing them.
	ContextLen    int    `json:"context_len,omitempty"`
	TokenizerHash string `json:"tokenizer_hash,omitempty"`
	// Capacity and BatchCapacity are the most requests (interactive,
	// batch) the worker holds at once, running and queued (its Ready
	// line; 0: not said): a frontend sends an instance no more open
	// streams of its own than that, and refuses the rest itself (429)
	// without an attempt.
	Capacity      int `json:"capacity,omitempty"`
	BatchCapacity int `json:"batch_capacity,omitempty"`
	// Continuation is the guarantee a continuation of the instance's
	// sequences on another of its numerics keeps ("bit-exact",
	// "token-exact"; its worker's Ready line): a stream's end says which
	// held.
	Continuation string `json:"continuation,omitempty"`
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

// FrontendsPrefix is where each frontend announces itself under its own
// lease (a FrontendRecord at FrontendsPrefix+id): the key lives while the
// frontend does. A draining agent waits for every frontend listed here to
// acknowledge its draining registrations.
const FrontendsPrefix = "/lifeline/v1/frontends/"

// FrontendRecord is the value of a frontend key.
type FrontendRecord struct {
	ID string `json:"id"`
	// AppliedRevision is the etcd revision up to which the frontend's
	// routing view holds every change under InstancesPrefix, and no request
	// it picked under an older view is still on its way to a worker: a
	// registration written at revision R or earlier is acknowledged once
	// AppliedRevision >= R.
	AppliedRevision int64 `json:"applied_revision"`
	UpdatedUnixNano int64 `json:"updated_unix_nano"`
}

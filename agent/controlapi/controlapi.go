// Package controlapi is the node agent's control API: the JSON documents
// its control socket serves (status, workers, events, KV slots) and that
// nodectl and operators' tools read, with the event kinds and failure
// classes they carry. It is a leaf, so a client of the socket links none
// of the agent.
package controlapi

import "time"

// Failure classes, as events and metrics name them.
const (
	ReasonExitCode      = "exit_code"
	ReasonSignal        = "signal"
	ReasonOOM           = "oom_kill"
	ReasonCanaryTimeout = "canary_timeout"
	ReasonCanaryError   = "canary_error"
	ReasonGPUXid        = "gpu_xid"
)

// Event kinds.
const (
	EventStarted   = "started"
	EventReady     = "ready"
	EventNotReady  = "not_ready"
	EventExit      = "exit"
	EventCrashLoop = "crash_loop"
	EventLeaseLost = "lease_lost"
	// EventLeaseKept: renewals came back after a gap longer than the TTL
	// and etcd still held the lease (a new leader extends every lease):
	// the workers accept again at their generations.
	EventLeaseKept    = "lease_kept"
	EventReregistered = "reregistered"
	EventAdopted      = "adopted"
	// EventRetry: an instance in crash_loop is tried again, after its
	// cool-down or because an operator reset it.
	EventRetry = "retry"
	// EventDrain: a drain moved to a new phase (Detail names it).
	EventDrain = "drain"
	// EventGroupEnded: a tensor-parallel group's ranks were all ended
	// after a rank's death (Detail says how fast).
	EventGroupEnded = "group_ended"
	// EventStrayEnded: worker processes of the instance a previous agent
	// process started and nobody adopts (it died before it recorded them,
	// or their adoption failed) were ended before a new worker started
	// (Detail lists them).
	EventStrayEnded = "stray_ended"
)

// Drain phases, in order. An undrain goes drained → undraining → none.
const (
	DrainWaitingForBudget = "waiting_for_budget"
	DrainNotReady         = "not_ready"
	DrainInFlight         = "in_flight"
	DrainStopping         = "stopping"
	DrainDrained          = "drained"
	DrainUndraining       = "undraining"
)

// DrainRequest is the body of POST /v1/drain. Durations are Go duration
// strings ("60s"); empty ones take the defaults.
type DrainRequest struct {
	// Deadline bounds how long requests in flight may run on: those left
	// then end with a retryable DRAINING error and move elsewhere.
	Deadline string `json:"deadline,omitempty"`
	// HardDeadline bounds the whole drain: by then the workers are stopped
	// whatever happens.
	HardDeadline string `json:"hard_deadline,omitempty"`
	// NoWait refuses the drain (ErrBudgetTaken) instead of waiting when
	// the disruption budget is taken by other nodes.
	NoWait bool `json:"no_wait,omitempty"`
}

// Drain is a node's drain as the control API shows it.
type Drain struct {
	Phase        string    `json:"phase"`
	Trigger      string    `json:"trigger"`
	StartedAt    time.Time `json:"started_at"`
	Deadline     time.Time `json:"deadline"`
	HardDeadline time.Time `json:"hard_deadline"`
	// InFlight is the requests the node's workers still serve.
	InFlight int `json:"in_flight"`
	// ActiveAtStart is the requests in flight when the instances became
	// not ready; RoutedAfterNotReady those the workers started after the
	// frontends acknowledged it (or the settle bound passed), before they
	// refused new requests (0 when frontends keep their word); ForcedEnded
	// those the drain ended (retryable DRAINING error) by its deadline:
	// MovedEarly (they could not finish before it, ended at once so that
	// they migrate) plus EndedAtDeadline (still running when it passed).
	// FinishedInPlace is those the drain let finish here that did.
	ActiveAtStart       int `json:"active_at_start"`
	RoutedAfterNotReady int `json:"routed_after_not_ready"`
	ForcedEnded         int `json:"forced_ended"`
	MovedEarly          int `json:"moved_early"`
	EndedAtDeadline     int `json:"ended_at_deadline"`
	FinishedInPlace     int `json:"finished_in_place"`
	// Frontends is the live frontends the settle step waited for;
	// FrontendsAcked those that acknowledged the draining registrations;
	// AllAcked says all did within the settle bound (true with none);
	// AckWait is how long the settle step waited.
	Frontends      int           `json:"frontends"`
	FrontendsAcked int           `json:"frontends_acked"`
	AllAcked       bool          `json:"all_acked"`
	AckWait        time.Duration `json:"ack_wait_ns"`
	// DrainedAt is when the workers were stopped (zero before).
	DrainedAt time.Time `json:"drained_at,omitzero"`
	// BudgetHeld says the node holds a share of the disruption budget;
	// Detail says why it waits, or anything else worth knowing.
	BudgetHeld bool   `json:"budget_held"`
	Detail     string `json:"detail,omitempty"`
}

// Event is one thing that happened to an instance or the agent.
type Event struct {
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	Node       string    `json:"node"`
	Kind       string    `json:"kind"`
	InstanceID string    `json:"instance_id,omitempty"`
	Generation uint64    `json:"generation,omitempty"`
	PID        int       `json:"pid,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	ExitCode   int       `json:"exit_code,omitempty"`
	Signal     int       `json:"signal,omitempty"`
	Detector   string    `json:"detector,omitempty"`
	// DetectedAt is when the detector saw a death (kernel time for eBPF).
	DetectedAt time.Time `json:"detected_at,omitzero"`
	Detail     string    `json:"detail,omitempty"`
}

// Worker is one entry of `nodectl workers --json`; the keys are stable.
type Worker struct {
	InstanceID string `json:"instance_id"`
	Role       string `json:"role"`
	Rank       int    `json:"rank"`
	PID        int    `json:"pid"`
	Generation uint64 `json:"generation"`
	Ready      bool   `json:"ready"`
	LastExit   *Event `json:"last_exit"`
	// Beyond the documented keys, for humans.
	State    string `json:"state"`
	NotReady string `json:"not_ready,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Restarts int    `json:"restarts"`
	// NextAttempt is when an instance in crash_loop is tried again (zero
	// otherwise); CrashLoops counts its crash loops in a row, each of which
	// doubles the cool-down.
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	CrashLoops  int       `json:"crash_loops,omitempty"`
	// StartError is why the instance's last worker could not start (its
	// model did not load), until one starts.
	StartError string `json:"start_error,omitempty"`
	// TP is the instance's tensor-parallel degree (0 or 1: one process);
	// Ranks its processes, rank 0 (PID) first.
	TP    int        `json:"tp,omitempty"`
	Ranks []RankProc `json:"ranks,omitempty"`
}

// RankProc is one rank process of a tensor-parallel instance.
type RankProc struct {
	Rank int `json:"rank"`
	PID  int `json:"pid"`
}

// Status is `nodectl status --json`.
type Status struct {
	// PID is the agent's own process id.
	PID              int            `json:"pid"`
	NodeID           string         `json:"node_id"`
	Detector         string         `json:"detector"`
	DetectorFallback string         `json:"detector_fallback,omitempty"`
	Etcd             EtcdStatus     `json:"etcd"`
	GPU              string         `json:"gpu"`
	Arena            map[string]any `json:"arena"`
	Instances        []Worker       `json:"instances"`
	UptimeSeconds    float64        `json:"uptime_seconds"`
	KVTransfer       TransferStatus `json:"kv_transfer"`
	// Drain is the node's drain; absent when none is in progress.
	Drain *Drain `json:"drain,omitempty"`
}

// TransferStatus is the KV transfer engine as `nodectl status` shows it:
// the transport in use and why, the endpoint, and the counters.
type TransferStatus struct {
	TransportStatus
	Addr  string        `json:"addr"`
	Stats TransferStats `json:"stats"`
}

// TransportStatus is the KV transport in use and why. The agent converts
// its engine's status to this type; the conversion fails to compile if
// the two ever differ.
type TransportStatus struct {
	Transport  string   `json:"transport"`
	Reason     string   `json:"reason"`
	Devices    []string `json:"rdma_devices"`
	Device     string   `json:"rdma_device,omitempty"`
	VerbsBuilt bool     `json:"verbs_built"`
}

// TransferStats are the transfer engine's counters. The agent converts
// its engine's counters to this type; the conversion fails to compile if
// the two ever differ.
type TransferStats struct {
	FetchesServed   uint64 `json:"fetches_served"`
	BlocksServed    uint64 `json:"blocks_served"`
	BytesServed     uint64 `json:"bytes_served"`
	PullsOK         uint64 `json:"pulls_ok"`
	PullsFailed     uint64 `json:"pulls_failed"`
	StaleDropped    uint64 `json:"stale_dropped"`
	BlocksPulled    uint64 `json:"blocks_pulled"`
	BytesPulled     uint64 `json:"bytes_pulled"`
	BlocksLocal     uint64 `json:"blocks_local"`
	SourceFailures  uint64 `json:"source_failures"`
	ChecksumErrors  uint64 `json:"checksum_errors"`
	StagedAborted   uint64 `json:"staged_aborted"`
	PullsInProgress int64  `json:"pulls_in_progress"`
}

// EtcdStatus says whether the agent can prove it is routable.
type EtcdStatus struct {
	Endpoints     []string `json:"endpoints"`
	LeaseID       int64    `json:"lease_id"`
	Routable      bool     `json:"routable"`
	LastRenewalMs int64    `json:"last_renewal_ms_ago"`
}

// EtcdMember is one etcd member as the agent sees it (`nodectl status`,
// GET /v1/etcd/members): its client URLs, whether it answered a status
// call within a second, and if so its view: the leader, its database
// size, its raft index and any alarm.
type EtcdMember struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	ClientURLs []string `json:"client_urls"`
	Healthy    bool     `json:"healthy"`
	Leader     bool     `json:"leader"`
	DBSize     int64    `json:"db_size_bytes,omitempty"`
	RaftIndex  uint64   `json:"raft_index,omitempty"`
	Errors     []string `json:"errors,omitempty"`
	Error      string   `json:"error,omitempty"`
}

// Slot is one entry of `nodectl kv ls --json`: a KV arena slot that is not
// free. The agent converts the owner's slot records to this type.
type Slot struct {
	Slot       uint32    `json:"slot"`
	Generation uint64    `json:"generation"`
	State      string    `json:"state"`
	Key        string    `json:"key,omitempty"`
	Writer     string    `json:"writer"`
	PayloadLen uint32    `json:"payload_len"`
	Leases     int       `json:"leases"`
	LastUsed   time.Time `json:"last_used,omitzero"`
}

// Error is the body of every control-socket error. Code is stable and
// typed: errors.Is matches an *Error against the sentinels below by code.
type Error struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is an *Error of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code != "" && t.Code == e.Code
}

// Error codes, and sentinels to match them with errors.Is.
var (
	ErrNoSuchEndpoint  = &Error{Code: "no_such_endpoint", Message: "no such endpoint"}
	ErrBadRequest      = &Error{Code: "bad_request", Message: "bad request"}
	ErrUnknownInstance = &Error{Code: "unknown_instance", Message: "no such instance on this node"}
	ErrNotInCrashLoop  = &Error{Code: "not_in_crash_loop", Message: "the instance is not in crash_loop"}
	// ErrBudgetTaken: a drain with no_wait found the disruption budget
	// taken by other nodes.
	ErrBudgetTaken = &Error{Code: "budget_taken", Message: "the disruption budget is taken"}
	// ErrNotDrained: undrain of a node that is not drained (or waiting to).
	ErrNotDrained = &Error{Code: "not_drained", Message: "the node is not drained"}
	// ErrDrainInProgress: undrain while a drain is still running.
	ErrDrainInProgress = &Error{Code: "drain_in_progress", Message: "a drain is in progress"}
)

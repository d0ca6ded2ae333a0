// Package agent is the node agent: one per GPU host, run by systemd. It
// spawns and supervises worker instances, gives every start a strictly
// higher generation, registers ready instances in etcd under a lease,
// detects worker deaths with eBPF (pidfd as fallback) and acts on them at
// once, owns the node's KV arena, and answers nodectl on a unix socket.
// The agent is not on the token path: its restart does not cut streams.
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// ErrBadConfig is wrapped by every configuration error.
var ErrBadConfig = errors.New("agent: bad config")

// Duration is a time.Duration that reads "3s" from JSON.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string like \"3s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// InstanceSpec asks for Count instances of one role and model.
type InstanceSpec struct {
	Role string `json:"role"`
	// Engine is "lifeline" (the default: the reference engine, on Preset's
	// synthetic weights or on Model, a GGUF file or a Hugging Face
	// directory it computes) or "llamacpp": Model is then a GGUF file
	// served by llama.cpp (a lifeline built with the llamacpp tag), its
	// context capped at ContextLen (0: at most 4,096), GPULayers layers
	// on the GPU (a CUDA build). A model is served as ServedName
	// (default: the file's base name without .gguf, or the directory's).
	Engine     string `json:"engine,omitempty"`
	Model      string `json:"model,omitempty"`
	ServedName string `json:"served_model_name,omitempty"`
	ContextLen int    `json:"context,omitempty"`
	GPULayers  int    `json:"gpu_layers,omitempty"`
	// GPU pins a llama.cpp instance's workers to one device: its index in
	// PCI bus order, NVML's (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
	// are set for them). A critical error (XID, double-bit ECC) on another
	// device leaves a pinned instance serving; an unpinned one is marked
	// not ready by an error on any device.
	GPU        *int   `json:"gpu,omitempty"`
	Preset     string `json:"preset"`
	WeightSeed uint64 `json:"weight_seed"`
	Count      int    `json:"count"`
	// MaxRunning and MaxQueued are the worker scheduler's hard limits
	// (0: the engine's defaults).
	MaxRunning int `json:"max_running"`
	MaxQueued  int `json:"max_queued"`
	// Threads bounds the CPU threads the worker computes on at once
	// (GOMAXPROCS); 0: every CPU. On a host of several workers it keeps
	// one worker's load off another's (results do not depend on it).
	Threads int `json:"threads,omitempty"`
	// DraftPreset or DraftLayers turn on speculative decoding in the
	// workers, DraftK draft tokens per step (0: the engine's default).
	DraftPreset string `json:"draft_preset,omitempty"`
	DraftLayers int    `json:"draft_layers,omitempty"`
	DraftK      int    `json:"draft_k,omitempty"`
	// TP, above 1, makes each instance a tensor-parallel group of TP
	// worker processes (ranks; group.go): one endpoint, one registration,
	// one generation; any rank's death fails and restarts the whole group.
	TP int `json:"tp,omitempty"`
	// SyntheticRate, above 0, serves Preset's synthetic engine instead:
	// for load tests only, it computes nothing and takes a step (a token
	// for every running sequence) this many times a second; its model is
	// "synthetic-<preset>" (decode/synthetic.go).
	SyntheticRate float64 `json:"synthetic_tokens_per_second,omitempty"`
	// StepInterval, for tests and drills, paces the reference engine: a
	// step no sooner than this ("20ms") after the previous one, so that a
	// tiny model's streams last long enough to be cut mid-way.
	StepInterval Duration `json:"step_interval,omitempty"`
}

// ranks is how many processes an instance of s is.
func (s InstanceSpec) ranks() int { return max(s.TP, 1) }

// llamaCpp says whether s is served by llama.cpp.
func (s InstanceSpec) llamaCpp() bool { return s.Engine == decode.EngineLlamaCpp }

// label names s's model in its instance ids: the preset, or the model's
// served name cut to 24 letters, digits, '.', '_' and '-'.
func (s InstanceSpec) label() string {
	if s.Model == "" && s.SyntheticRate > 0 {
		return "synthetic-" + s.Preset
	}
	if s.Model == "" {
		return s.Preset
	}
	name := s.ServedName
	if name == "" {
		name = decode.GGUFName(s.Model)
	}
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	label := string(b[:min(len(b), 24)])
	if s.GPU != nil {
		// One model on each of a host's GPUs: an instance per device.
		label += fmt.Sprintf("-gpu%d", *s.GPU)
	}
	return label
}

// Options are the agent's whole configuration, from a JSON file and flags.
type Options struct {
	NodeID  string `json:"node_id"`
	DataDir string `json:"data_dir"`
	Socket  string `json:"socket"`
	Metrics string `json:"metrics_listen"`
	// OTLPEndpoint, when set, is an OTLP/gRPC collector the agent's trace
	// spans are exported to (else OTEL_EXPORTER_OTLP_ENDPOINT, else
	// nowhere; /debug/traces on the metrics listener has them in any
	// case); OTLPInsecure speaks plaintext to it.
	OTLPEndpoint string   `json:"otlp_endpoint,omitempty"`
	OTLPInsecure bool     `json:"otlp_insecure,omitempty"`
	Etcd         []string `json:"etcd"`
	// EtcdTLS connects to etcd with mutual TLS, presenting the node
	// certificate from CertDir and trusting only the cluster CA.
	EtcdTLS bool   `json:"etcd_tls"`
	CertDir string `json:"certs"`
	// ArenaPath is the node's KV arena file; ArenaSlots × ArenaSlotBytes.
	ArenaPath      string `json:"arena"`
	ArenaSlots     int    `json:"arena_slots"`
	ArenaSlotBytes int    `json:"arena_slot_bytes"`

	Instances []InstanceSpec `json:"instances"`

	LeaseTTL        Duration `json:"lease_ttl"`
	CanaryIdle      Duration `json:"canary_idle"`
	CanaryTimeout   Duration `json:"canary_timeout"`
	CanaryFailures  int      `json:"canary_failures"`
	RestartBackoff  Duration `json:"restart_backoff"`
	RestartMax      Duration `json:"restart_backoff_max"`
	CrashLoopLimit  int      `json:"crash_loop_limit"`
	CrashLoopWindow Duration `json:"crash_loop_window"`
	// CrashLoopCooldown is how long an instance stays in crash_loop before
	// it is tried again; every further crash loop in a row doubles it, up
	// to CrashLoopCooldownMax. `nodectl reset` retries at once.
	CrashLoopCooldown    Duration `json:"crash_loop_cooldown"`
	CrashLoopCooldownMax Duration `json:"crash_loop_cooldown_max"`
	// WorkerOrphanTimeout is how long a worker waits for its agent —
	// gone, and not restarted to adopt it — before it stops and frees its
	// memory (default 3 minutes: longer than an agent restart).
	WorkerOrphanTimeout Duration `json:"worker_orphan_timeout"`
	// DrainDeadline and DrainHardDeadline bound the drain SIGTERM runs
	// (a systemd stop): requests still in flight at the deadline end with
	// a retryable DRAINING error, and the agent exits before the hard
	// deadline whatever happens (the defaults, 30 s and 50 s, fit the
	// unit's TimeoutStopSec=60). DrainSettle bounds how long a drain
	// waits, once its registrations say draining, for every live frontend
	// to acknowledge them (stop routing to the node) before its workers
	// refuse new requests: the wait ends as soon as all have, at once
	// with no frontend registered.
	DrainDeadline     Duration `json:"drain_deadline"`
	DrainHardDeadline Duration `json:"drain_hard_deadline"`
	DrainSettle       Duration `json:"drain_settle"`
	// WorkerBinary is the lifeline executable to spawn workers with
	// (default: this executable).
	WorkerBinary string `json:"worker_binary"`
	// Detector is "auto" (eBPF, else pidfd), "ebpf" or "pidfd".
	Detector string `json:"detector"`
	// WorkerCgroup, if set, is a cgroup directory (v1 or v2) every worker
	// is moved into right after it starts, before it loads a model: its
	// memory limit then takes the worker, never the agent, when it is hit.
	WorkerCgroup string `json:"worker_cgroup"`
	// TransferListen is the UDP address of the agent's KV transfer endpoint
	// (QUIC, mutual TLS; default 127.0.0.1:0); TransferAdvertise is the
	// address peers and frontends are told (default: the bound address).
	TransferListen    string `json:"transfer_listen"`
	TransferAdvertise string `json:"transfer_advertise"`
	// BindAddress is the IP of the interface the workers' QUIC endpoints
	// listen on and the agent's canaries dial them from (default
	// 127.0.0.1: workers reachable from this host only). It names one
	// address, never every interface: a registration tells frontends
	// where to dial. KV transfers to peers leave from TransferListen's
	// address (or, when that is unspecified, the one routing to the peer).
	BindAddress string `json:"bind_address"`
	// RDMAGIDIndex is the GID index the verbs transport addresses peers
	// with (binaries built with the rdma tag, on RDMA hardware): on RoCE
	// v2 fabrics, the index of the transfer interface's RoCE v2 GID
	// (show_gids); 0 suits InfiniBand.
	RDMAGIDIndex int `json:"rdma_gid_index"`
	// GPU opens the node's GPU watcher (nvmlgpu.Open in the lifeline
	// binary); nil or ErrNoGPU: the agent runs without GPU checks and its
	// status says why. Not configuration: the binary sets it.
	GPU func() (GPUWatcher, error) `json:"-"`
}

// Defaults fills unset fields.
func (o *Options) Defaults() {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&o.LeaseTTL, 3*time.Second)
	def(&o.CanaryIdle, 5*time.Second)
	def(&o.CanaryTimeout, time.Second)
	def(&o.RestartBackoff, 100*time.Millisecond)
	def(&o.RestartMax, 5*time.Second)
	def(&o.CrashLoopWindow, time.Minute)
	def(&o.CrashLoopCooldown, 10*time.Second)
	def(&o.CrashLoopCooldownMax, 5*time.Minute)
	def(&o.WorkerOrphanTimeout, 3*time.Minute)
	def(&o.DrainDeadline, 30*time.Second)
	def(&o.DrainHardDeadline, 50*time.Second)
	def(&o.DrainSettle, 2*time.Second)
	if o.CanaryFailures == 0 {
		o.CanaryFailures = 3
	}
	if o.CrashLoopLimit == 0 {
		o.CrashLoopLimit = 5
	}
	if o.ArenaSlots == 0 {
		o.ArenaSlots = 1024
	}
	if o.ArenaSlotBytes == 0 {
		o.ArenaSlotBytes = 131072
	}
	if o.Detector == "" {
		o.Detector = "auto"
	}
	if o.TransferListen == "" {
		o.TransferListen = "127.0.0.1:0"
	}
	if o.BindAddress == "" {
		o.BindAddress = "127.0.0.1"
	}
	if o.WorkerBinary == "" {
		o.WorkerBinary, _ = os.Executable()
	}
	for i := range o.Instances {
		if o.Instances[i].WeightSeed == 0 && !o.Instances[i].llamaCpp() {
			o.Instances[i].WeightSeed = 1
		}
	}
}

// Validate reports the first bad field by its JSON name.
func (o *Options) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrBadConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case pki.ValidNode(o.NodeID) != nil: // it names the agent's certificate and etcd keys
		return bad("node_id", "%v", pki.ValidNode(o.NodeID))
	case o.DataDir == "":
		return bad("data_dir", "empty")
	case o.Socket == "":
		return bad("socket", "empty")
	case len(o.Etcd) == 0:
		return bad("etcd", "no endpoints")
	case o.CertDir == "":
		return bad("certs", "empty: components only talk mutual TLS")
	case o.ArenaPath == "":
		return bad("arena", "empty")
	case o.ArenaSlots <= 0:
		return bad("arena_slots", "%d", o.ArenaSlots)
	case o.ArenaSlotBytes <= 0:
		return bad("arena_slot_bytes", "%d", o.ArenaSlotBytes)
	case time.Duration(o.LeaseTTL) < time.Second || time.Duration(o.LeaseTTL)%time.Second != 0:
		return bad("lease_ttl", "%v (etcd leases are whole seconds, at least 1s)", time.Duration(o.LeaseTTL))
	case o.CanaryIdle <= 0:
		return bad("canary_idle", "%v (must be positive)", time.Duration(o.CanaryIdle))
	case o.CanaryTimeout <= 0:
		return bad("canary_timeout", "%v (must be positive)", time.Duration(o.CanaryTimeout))
	case o.RestartBackoff <= 0:
		return bad("restart_backoff", "%v (must be positive)", time.Duration(o.RestartBackoff))
	case o.CrashLoopWindow <= 0:
		return bad("crash_loop_window", "%v (must be positive)", time.Duration(o.CrashLoopWindow))
	case o.CanaryFailures < 1:
		return bad("canary_failures", "%d", o.CanaryFailures)
	case o.CrashLoopLimit < 1:
		return bad("crash_loop_limit", "%d", o.CrashLoopLimit)
	case o.Detector != "auto" && o.Detector != "ebpf" && o.Detector != "pidfd":
		return bad("detector", "%q (auto, ebpf or pidfd)", o.Detector)
	case o.RestartMax < o.RestartBackoff:
		return bad("restart_backoff_max", "%v is below restart_backoff %v", time.Duration(o.RestartMax), time.Duration(o.RestartBackoff))
	}
	if err := o.validateRecovery(bad); err != nil {
		return err
	}
	if err := o.validateAddresses(bad); err != nil {
		return err
	}
	if o.RDMAGIDIndex < 0 || o.RDMAGIDIndex > 255 {
		return bad("rdma_gid_index", "%d (0..255)", o.RDMAGIDIndex)
	}
	if o.WorkerCgroup != "" {
		if _, err := os.Stat(filepath.Join(o.WorkerCgroup, "cgroup.procs")); err != nil {
			return bad("worker_cgroup", "%q is not a cgroup directory: %v", o.WorkerCgroup, err)
		}
	}
	return o.validateInstances(bad)
}

// validateInstances checks the instances' specs.
func (o *Options) validateInstances(bad func(field, format string, args ...any) error) error {
	seen := map[string]int{}
	for i, in := range o.Instances {
		key := fmt.Sprintf("%s/%s/tp%d", in.Role, in.label(), in.ranks())
		if j, dup := seen[key]; dup {
			return bad(fmt.Sprintf("instances[%d]", i), "same role and model as instances[%d]: merge their counts (or name the model otherwise: served_model_name)", j)
		}
		seen[key] = i
		if in.Engine != "" && in.Engine != decode.EngineLifeline {
			if err := o.validateLlamaCpp(i, in, bad); err != nil {
				return err
			}
			continue
		}
		switch {
		case in.Role != "decode" && in.Role != "prefill" && in.Role != "both":
			return bad(fmt.Sprintf("instances[%d].role", i), "%q (decode, prefill or both)", in.Role)
		case in.GPU != nil:
			return bad(fmt.Sprintf("instances[%d].gpu", i), "pins a GPU for engine %q: the reference engine computes on the CPU", decode.EngineLlamaCpp)
		case in.GPULayers != 0:
			return bad(fmt.Sprintf("instances[%d].gpu_layers", i), "layers on the GPU are engine %q's: the reference engine computes on the CPU", decode.EngineLlamaCpp)
		case in.Model != "":
			if err := o.validateModelFile(i, in, bad); err != nil {
				return err
			}
		case in.Preset != "tiny" && in.Preset != "small":
			return bad(fmt.Sprintf("instances[%d].preset", i), "%q (tiny or small)", in.Preset)
		case in.Count < 0 || in.Count > 64:
			return bad(fmt.Sprintf("instances[%d].count", i), "%d (0..64)", in.Count)
		case in.MaxRunning < 0 || in.MaxQueued < 0:
			return bad(fmt.Sprintf("instances[%d].max_running", i), "%d / max_queued %d (0 = default)", in.MaxRunning, in.MaxQueued)
		case in.Threads < 0 || in.Threads > 1024:
			return bad(fmt.Sprintf("instances[%d].threads", i), "%d (0..1024, 0 = every CPU)", in.Threads)
		case in.DraftPreset != "" && in.DraftPreset != "tiny" && in.DraftPreset != "small", in.DraftPreset != "" && in.DraftLayers != 0:
			return bad(fmt.Sprintf("instances[%d].draft_preset", i), "%q (tiny or small, and not with draft_layers)", in.DraftPreset)
		case in.DraftLayers < 0 || in.DraftK < 0 || in.DraftK > 16:
			return bad(fmt.Sprintf("instances[%d].draft_layers", i), "%d / draft_k %d (draft_k 0..16, 0 = default)", in.DraftLayers, in.DraftK)
		case in.TP < 0 || in.TP > collective.MaxRanks:
			return bad(fmt.Sprintf("instances[%d].tp", i), "%d (0..%d; 0 and 1: one process)", in.TP, collective.MaxRanks)
		case in.TP > 1 && (in.DraftPreset != "" || in.DraftLayers != 0):
			return bad(fmt.Sprintf("instances[%d].tp", i), "tp %d with speculative decoding is not built", in.TP)
		case in.SyntheticRate < 0 || in.SyntheticRate > decode.SyntheticMaxRate:
			return bad(fmt.Sprintf("instances[%d].synthetic_tokens_per_second", i), "%v (0: off, up to %d)", in.SyntheticRate, decode.SyntheticMaxRate)
		case in.SyntheticRate > 0 && (in.Role != "decode" || in.TP > 1 || in.DraftPreset != "" || in.DraftLayers != 0):
			return bad(fmt.Sprintf("instances[%d].synthetic_tokens_per_second", i), "the synthetic engine is a decode instance of one process without a draft")
		case in.StepInterval < 0 || time.Duration(in.StepInterval) > decode.MaxStepInterval:
			return bad(fmt.Sprintf("instances[%d].step_interval", i), "%v (0: off, up to %v)", time.Duration(in.StepInterval), decode.MaxStepInterval)
		case in.StepInterval > 0 && in.SyntheticRate > 0:
			return bad(fmt.Sprintf("instances[%d].step_interval", i), "paces the reference engine; the synthetic engine's pace is synthetic_tokens_per_second")
		}
		if cfg, err := model.PresetConfig(in.Preset); err == nil && in.TP > 1 && cfg.SplitsInto(in.TP) != nil {
			return bad(fmt.Sprintf("instances[%d].tp", i), "%v", cfg.SplitsInto(in.TP))
		}
	}
	return nil
}

// validateModelFile checks instance spec i of the reference engine with
// a model file: a checkpoint the engine does not compute is refused here
// by name (llama.cpp may serve it), never a worker's crash loop.
func (o *Options) validateModelFile(i int, in InstanceSpec, bad func(field, format string, args ...any) error) error {
	at := fmt.Sprintf("instances[%d]", i)
	switch {
	case in.Preset != "" || in.TP > 1 || in.DraftPreset != "" || in.DraftLayers != 0:
		return bad(at+".preset", "preset, tp and draft settings do not go with a model file")
	case in.Role != "decode" && in.Role != "both":
		return bad(at+".role", "%q: an instance of a model file decodes (decode or both)", in.Role)
	case in.Count < 0 || in.Count > 64:
		return bad(at+".count", "%d (0..64)", in.Count)
	case in.MaxRunning < 0 || in.MaxQueued < 0 || in.Threads < 0 || in.ContextLen < 0:
		return bad(at+".max_running", "max_running, max_queued, threads and context must not be negative")
	case len(instanceID(o.NodeID, in, 63)) > 63:
		return bad(at+".served_model_name", "instance ids %q would be over 63 characters: a shorter served_model_name or node_id", instanceID(o.NodeID, in, 0))
	case !filepath.IsAbs(in.Model):
		return bad(at+".model", "%q: an absolute path (workers start in another directory)", in.Model)
	}
	if err := decode.CheckModel(in.Model); err != nil {
		return bad(at+".model", "%v (engine %q may serve it)", err, decode.EngineLlamaCpp)
	}
	return nil
}

// validateLlamaCpp checks instance spec i of engine llamacpp, and its
// GGUF file: a file llama.cpp cannot serve, or a worker binary without
// llama.cpp, is refused here by name, never a worker's crash loop.
func (o *Options) validateLlamaCpp(i int, in InstanceSpec, bad func(field, format string, args ...any) error) error {
	at := fmt.Sprintf("instances[%d]", i)
	switch {
	case in.Engine != decode.EngineLlamaCpp:
		return bad(at+".engine", "%q (%s or %s)", in.Engine, decode.EngineLifeline, decode.EngineLlamaCpp)
	case in.Role != "decode":
		return bad(at+".role", "%q: a llama.cpp instance is a decode instance (prefill hand-off is the reference engine's)", in.Role)
	case in.Model == "":
		return bad(at+".model", "empty: the GGUF file the instance serves")
	case in.Preset != "" || in.TP > 1 || in.DraftPreset != "" || in.DraftLayers != 0 || in.StepInterval != 0:
		return bad(at+".preset", "preset, tp, draft and step_interval settings are the reference engine's, not %s's", decode.EngineLlamaCpp)
	case in.Count < 0 || in.Count > 64:
		return bad(at+".count", "%d (0..64)", in.Count)
	case in.MaxRunning < 0 || in.MaxQueued < 0 || in.Threads < 0 || in.ContextLen < 0 || in.GPULayers < 0:
		return bad(at+".max_running", "max_running, max_queued, threads, context and gpu_layers must not be negative")
	case in.GPU != nil && (*in.GPU < 0 || *in.GPU > 63):
		return bad(at+".gpu", "%d (a device index 0..63, in PCI bus order as nvidia-smi lists them)", *in.GPU)
	case len(instanceID(o.NodeID, in, 63)) > 63:
		return bad(at+".served_model_name", "instance ids %q would be over 63 characters: a shorter served_model_name or node_id", instanceID(o.NodeID, in, 0))
	}
	if !filepath.IsAbs(in.Model) {
		return bad(at+".model", "%q: an absolute path (workers start in another directory)", in.Model)
	}
	if _, err := decode.CheckGGUF(in.Model); err != nil {
		return bad(at+".model", "%v", err)
	}
	if self, _ := os.Executable(); o.WorkerBinary == self && !gguf.Linked {
		return bad(at+".engine", "%v", decode.ErrNoLlamaCpp)
	}
	return nil
}

// validateAddresses checks the transfer endpoint's and the workers'
// addresses: each names one interface unless the configuration says where
// peers must connect instead.
func (o *Options) validateAddresses(bad func(field, format string, args ...any) error) error {
	if host, _, err := net.SplitHostPort(o.TransferListen); err != nil {
		return bad("transfer_listen", "%q: %v", o.TransferListen, err)
	} else if ip := net.ParseIP(host); (host == "" || (ip != nil && ip.IsUnspecified())) && o.TransferAdvertise == "" {
		return bad("transfer_advertise", "required when transfer_listen %q names no single address: peers must be told where to connect", o.TransferListen)
	}
	if ip := net.ParseIP(o.BindAddress); ip == nil || ip.IsUnspecified() {
		return bad("bind_address", "%q (one interface's IP address, not a name or the wildcard)", o.BindAddress)
	}
	return nil
}

// validateRecovery checks the crash-loop cool-down and the drain bounds.
func (o *Options) validateRecovery(bad func(field, format string, args ...any) error) error {
	switch {
	case o.CrashLoopCooldown <= 0:
		return bad("crash_loop_cooldown", "%v (must be positive)", time.Duration(o.CrashLoopCooldown))
	case o.CrashLoopCooldownMax < o.CrashLoopCooldown:
		return bad("crash_loop_cooldown_max", "%v is below crash_loop_cooldown %v", time.Duration(o.CrashLoopCooldownMax), time.Duration(o.CrashLoopCooldown))
	case o.DrainDeadline <= 0 || o.DrainSettle < 0:
		return bad("drain_deadline", "%v / drain_settle %v (must be positive)", time.Duration(o.DrainDeadline), time.Duration(o.DrainSettle))
	case o.DrainHardDeadline <= o.DrainDeadline:
		return bad("drain_hard_deadline", "%v is not after drain_deadline %v", time.Duration(o.DrainHardDeadline), time.Duration(o.DrainDeadline))
	}
	return nil
}

// LoadFile reads a JSON config; unknown fields are errors, so that a typo
// does not silently fall back to a default.
func LoadFile(path string, into *Options) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadConfig, path, err)
	}
	return nil
}

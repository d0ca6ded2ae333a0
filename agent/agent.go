package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/ebpf"
	"github.com/lifeline-llm/lifeline/internal/private"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/rdma"
)

// Agent is one node's agent.
type Agent struct {
	opts Options
	log  *slog.Logger

	db      *badger.DB
	etcd    *clientv3.Client
	kvOwner *kv.Owner
	// transfer moves KV blocks to and from peers; kvAddr is its advertised
	// endpoint and transport why it uses the transport it does.
	transfer  *rdma.Engine
	quic      *rdma.QUIC // the transfer engine's QUIC transport
	peers     *peers
	kvAddr    string
	transport rdma.Status
	kvSocket  string
	tlsConf   *tls.Config

	detector         ebpf.Detector
	detectorFallback error
	// ooms counts the worker cgroup's OOM kills (nil without one).
	ooms *oomCounter
	// gpu is nil without a GPU; gpuErr says why.
	gpu    GPUWatcher
	gpuErr error

	events  *eventLog
	metrics *metrics
	// tracing keeps and exports the agent's spans; tracer makes them.
	tracing *tracing.Tracing
	tracer  trace.Tracer
	// wg counts every goroutine the agent started (track): Run returns
	// only once all of them did.
	wg sync.WaitGroup

	mu        sync.Mutex
	instances map[string]*instance
	// byPID routes a detector report to the one process it is about, so
	// that a late report about a previous worker can never be taken for
	// the current one's death.
	byPID map[int]chan ebpf.Exit
	// regMu orders registrations against deregistrations: a snapshot of a
	// ready instance is never written after its death was acted on. It
	// guards reg.
	regMu sync.Mutex
	reg   registrar
	// gpuFaults are the devices with a critical GPU error: instances on
	// them stay not ready.
	gpuFaults  map[int]bool
	lease      clientv3.LeaseID
	leaseAlive time.Time
	started    time.Time
	// drain is the node's drain, nil when none is in progress; life is
	// the context everything runs under: it ends after SIGTERM's drain.
	drain *drain
	life  context.Context
}

// instance is one supervised worker instance (rank 0 only: tp = 1).
type instance struct {
	id   string
	spec InstanceSpec

	// Guarded by Agent.mu.
	gen      uint64
	kvGen    uint64 // the generation the worker started with: its KV writer identity
	pid      int
	rankPIDs []int // ranks 1..n-1 of a tensor-parallel group
	// groupEndedAt is when the group's last generation was ended (its
	// restart time runs from there to the next ready).
	groupEndedAt time.Time
	addr         string
	state        string // starting, running, restarting, crash_loop, stopped
	ready        bool
	notReady     string // reason when not ready
	// startError is why its last worker could not start (its Ready
	// line's error), until one starts.
	startError string
	lastExit   *controlapi.Event
	spawnFails int // consecutive failures to get a generation
	restarts   int
	model      string
	revision   string
	numerics   string
	kvIdentity *kv.Identity
	// contextLen and tokenizerHash are the worker's, registered for
	// frontends' prompt checks.
	contextLen    int
	tokenizerHash string
	// continuation is the guarantee its worker's Ready line claims.
	continuation string
	// capacity and batchCapacity are the worker's (its Ready line).
	capacity, batchCapacity int
	canaryFail              int
	// starting is the span of the worker's start until it is ready.
	starting   trace.Span
	running    int
	queued     int
	freeBlocks int
	// nextAttempt is when an instance in crash_loop is tried again;
	// crashLoops counts its crash loops in a row.
	nextAttempt time.Time
	crashLoops  int
	// reset wakes the instance's supervisor out of a crash loop's
	// cool-down (nodectl reset); sent to only under Agent.mu while the
	// instance is in crash_loop.
	reset chan struct{}
	// draining: a drain holds the instance; it is not ready and not
	// restarted. drainRegistered: it was ready when the drain began and
	// stays registered, marked draining, until its worker stops.
	// refusing: its worker was told to refuse new requests.
	draining        bool
	drainRegistered bool
	refusing        bool
	// stop ends the instance's supervisor (which stops its worker); done
	// is closed when the supervisor has returned.
	stop context.CancelFunc
	done chan struct{}
}

// Run starts the agent and blocks until ctx is done, then stops the
// workers and deregisters. Subsystems start in order, each on what the
// ones before it opened; their deferred closes run in reverse, and Run
// returns only once every goroutine it started has.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	opts.Defaults()
	if err := opts.Validate(); err != nil {
		return err
	}
	a, err := newAgent(opts, log)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.tracing.Shutdown(ctx)
	}()
	if err := a.openStore(); err != nil {
		return err
	}
	defer a.db.Close()
	if err := a.openKV(); err != nil {
		return err
	}
	defer a.kvOwner.Close()
	defer a.awaitGoroutines()
	// Everything runs under life, which outlives ctx by SIGTERM's drain.
	stop := ctx
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	a.life = ctx
	a.serveKV(ctx)
	if err := a.startTransfer(ctx); err != nil {
		return err
	}
	if err := a.startDetector(); err != nil {
		return err
	}
	defer a.detector.Close()
	a.startGPU(ctx)
	if err := a.startEtcd(ctx); err != nil {
		return err
	}
	defer a.etcd.Close()
	a.startPeers(ctx)
	if err := a.restoreDrained(); err != nil {
		return err
	}
	// The instances exist before the control socket answers: an undrain
	// sent as soon as it does must find them.
	start := a.createInstances()
	ctl, err := a.serveControl(ctx)
	if err != nil {
		return err
	}
	defer ctl.Close()
	if opts.Metrics != "" {
		if err := a.serveMetrics(ctx); err != nil {
			return err
		}
	}
	a.startSupervision(ctx, start)
	a.startSystemd(ctx)
	<-stop.Done()
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	a.drainOnStop()
	cancel()
	a.revokeLease()
	return nil
}

// newAgent is an agent with nothing started: its data directory exists
// and it holds the certificates it dials its workers with.
func newAgent(opts Options, log *slog.Logger) (*Agent, error) {
	a := &Agent{opts: opts, log: log.With("node_id", opts.NodeID), events: newEventLog(), metrics: newMetrics(), instances: map[string]*instance{},
		byPID: map[int]chan ebpf.Exit{}, started: time.Now()}
	a.metrics.reg.MustRegister(newCollector(a))
	a.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_agent_drain_running_seconds",
		Help: "How long the node's drain has been running (0: none): one that grows without end is stuck."}, a.drainRunning))
	tr, err := tracing.New(tracing.Options{Service: "lifeline-agent", Instance: opts.NodeID, Endpoint: opts.OTLPEndpoint, Insecure: opts.OTLPInsecure})
	if err != nil {
		return nil, err
	}
	a.tracing, a.tracer = tr, tr.Tracer("github.com/lifeline-llm/lifeline/agent")
	if opts.WorkerCgroup != "" {
		a.ooms = newOOMCounter(opts.WorkerCgroup)
	}
	if err := privateDir(opts.DataDir); err != nil {
		return nil, fmt.Errorf("agent: data_dir: %w", err)
	}
	if a.tlsConf, err = agentTLS(opts); err != nil {
		return nil, err
	}
	return a, nil
}

// privateDir creates dir, or narrows an existing one, to mode 0700:
// everything under the data directory (Badger's files, the KV socket) is
// the agent's user's alone, whatever the umask or an older release left.
// One another user owns, or could write into, or a symbolic link, is
// refused: what is in it may have been planted.
func privateDir(dir string) error {
	if err := private.Dir(dir); err != nil {
		return fmt.Errorf("agent: data_dir: %w", err)
	}
	return nil
}

// exitWait bounds how long Run waits, once stopped, for the goroutines it
// started: a stuck one must not keep the agent from exiting (systemd
// would kill it anyway, without a word about why).
const exitWait = 10 * time.Second

// awaitGoroutines waits for the goroutines Run started, at most exitWait;
// past that it logs every goroutine's stack and lets Run return.
func (a *Agent) awaitGoroutines() {
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(exitWait):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		a.log.Error("goroutines still running after the stop; exiting anyway", "wait", exitWait, "stacks", string(buf))
	}
}

// track runs f on a goroutine that Run waits for before it returns.
func (a *Agent) track(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

func (a *Agent) emit(e controlapi.Event) controlapi.Event {
	e.Node = a.opts.NodeID
	return a.events.add(e)
}

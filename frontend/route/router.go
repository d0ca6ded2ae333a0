// Package route is the frontend's router: its view of the registered
// instances (Update, Remove), the choice of an instance for a request
// (Pick: model and numerics, prefix affinity, load, prefill/decode roles,
// exclusions of instances and nodes that failed it) and the load view
// under bursts (load.go). It does no I/O, starts no goroutine and reads
// no clock (time is passed in); its lock makes it safe for concurrent
// use. It imports only the standard library and contract leaves
// (tools/checks holds it to that), so that it is tested alone.
package route

import (
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/kv/blockid"
)

// ErrNoInstance is returned when no ready instance can take a request.
var ErrNoInstance = errors.New("frontend: no ready instance")

// Instance is the router's view of one registered instance.
type Instance struct {
	ID            string
	Generation    uint64
	Model         string
	ModelRevision string
	NumericsID    string
	Ready         bool
	Draining      bool
	// Outstanding is the instance's running plus queued sequences.
	Outstanding int
	// Role is decode, prefill or both; Node the host; KVAddr its agent's
	// KV transfer endpoint.
	Role   string
	Node   string
	KVAddr string
	// KVIdentity describes the instance's KV blocks; nil when it does not
	// share them.
	KVIdentity *blockid.Identity
	// ContextLen and TokenizerHash are the worker's (0, "": not
	// registered): the admission check of prompt sizes.
	ContextLen    int
	TokenizerHash string
	// Capacity and BatchCapacity are the most requests (interactive,
	// batch) the worker holds at once (0: not said).
	Capacity, BatchCapacity int
	// Continuation is the guarantee a continuation of its sequences
	// keeps ("" : not said, "bit-exact", "token-exact").
	Continuation string
}

// Router picks instances. It keeps its last view when the registry is
// unreachable; Replace reconciles from a full read. It is safe for
// concurrent use: the registry watch updates it while requests pick.
type Router struct {
	// SuppressFor is how long an instance that failed a request is avoided
	// by every request of this frontend (default 5 s). Set it before use.
	SuppressFor time.Duration

	mu sync.Mutex
	// instances are the registered instances; departed those whose
	// registration vanished (lease expired, not ready) without a failure:
	// nothing new goes to them, but their streams go on, and their
	// generation still fences an older registration.
	instances  map[string]Instance
	departed   map[string]Instance
	suppressed map[string]suppression
	nodes      map[string]Node
	// models are those any registration named since the router started.
	models map[string]bool
	// streams counts this frontend's open decode streams per instance:
	// a registration's load is only as fresh as its agent's last look,
	// so a burst is spread by what this frontend sent itself.
	streams map[string]int
	// full are the instances that refused a request as overloaded, by
	// priority, until when they are taken as full for it: a batch refusal
	// says nothing of the room kept for interactive requests.
	full map[fullKey]time.Time
}

// Node is the router's view of one node agent: its KV transfer endpoint
// and the prefixes its arena holds published.
type Node struct {
	Name     string
	KVAddr   string
	Prefixes map[string]bool // first 8 bytes of published keys, hex
	Updated  time.Time
}

// UpdateNode records a node (a watch put).
func (rt *Router) UpdateNode(n Node) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.nodes[n.Name] = n
}

// RemoveNode drops a node (its agent's lease ended).
func (rt *Router) RemoveNode(name string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	delete(rt.nodes, name)
}

// ReplaceNodes reconciles the nodes with a full read.
func (rt *Router) ReplaceNodes(all []Node) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.nodes = map[string]Node{}
	for _, n := range all {
		rt.nodes[n.Name] = n
	}
}

// NewRouter returns an empty router.
func NewRouter() *Router {
	return &Router{SuppressFor: 5 * time.Second, instances: map[string]Instance{}, departed: map[string]Instance{}, suppressed: map[string]suppression{},
		nodes: map[string]Node{}, models: map[string]bool{}, streams: map[string]int{}, full: map[fullKey]time.Time{}}
}

// Update records a registration (a watch put) and reports whether it was
// taken. An older generation than the one known, registered or departed,
// is ignored: registrations only move forward.
func (rt *Router) Update(in Instance) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.update(in)
}

func (rt *Router) update(in Instance) bool {
	if rt.generationLocked(in.ID) > in.Generation {
		return false
	}
	rt.instances[in.ID] = in
	delete(rt.departed, in.ID)
	if sup, ok := rt.suppressed[in.ID]; ok && sup.fenced {
		delete(rt.suppressed, in.ID)
	}
	rt.models[in.Model] = true
	return true
}

// Deregister records that an instance's registration vanished (a watch
// delete): its agent's lease expired, or it is not ready. That is not a
// death: nothing new is routed to it, but it is remembered, at its
// generation, for the streams that go on on it, until it registers again
// or a failure is announced.
func (rt *Router) Deregister(id string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if in, ok := rt.instances[id]; ok {
		rt.departed[id] = in
		delete(rt.instances, id)
	}
}

// InstancesOf lists every instance of model the router knows, ready or
// not, registered or departed (a worker whose agent lost its lease still
// serves its streams).
func (rt *Router) InstancesOf(model string) []Instance {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []Instance
	for _, m := range []map[string]Instance{rt.instances, rt.departed} {
		for _, in := range m {
			if in.Model == model {
				out = append(out, in)
			}
		}
	}
	return out
}

// Remove forgets an instance.
func (rt *Router) Remove(id string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	delete(rt.instances, id)
	delete(rt.departed, id)
}

// Replace reconciles with a full read of the registry: a registered
// instance the read lacks has departed (as by a watch delete).
func (rt *Router) Replace(all []Instance) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	old := rt.instances
	rt.instances = map[string]Instance{}
	for id, in := range old {
		rt.departed[id] = in
	}
	for _, in := range all {
		rt.update(in)
	}
}

// Generation is the highest generation known of instance id, registered
// or departed (0 when neither): a frame stamped with an older one comes
// from an endpoint that another replaced.
func (rt *Router) Generation(id string) uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.generationLocked(id)
}

func (rt *Router) generationLocked(id string) uint64 {
	return max(rt.instances[id].Generation, rt.departed[id].Generation)
}

// Fail applies a failure of instance id at generations up to gen (0: the
// generation known): the instance is dropped unless a newer generation
// replaced it, and the endpoint is suppressed. It returns the generation
// it applied, so that a late notice about an older generation never
// touches the newer one.
func (rt *Router) Fail(id string, gen uint64, now time.Time) uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if gen == 0 {
		gen = rt.generationLocked(id)
	}
	if cur, ok := rt.instances[id]; ok && cur.Generation <= gen {
		delete(rt.instances, id)
	}
	if cur, ok := rt.departed[id]; ok && cur.Generation <= gen {
		delete(rt.departed, id)
	}
	rt.suppress(id, gen, now)
	return gen
}

// Instance is the last registration of instance id, if it is registered
// or departed without a failure.
func (rt *Router) Instance(id string) (Instance, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if in, ok := rt.instances[id]; ok {
		return in, true
	}
	in, ok := rt.departed[id]
	return in, ok
}

// NodeOf is the node of instance id ("" when it is not registered).
func (rt *Router) NodeOf(id string) string {
	in, _ := rt.Instance(id)
	return in.Node
}

// HasModel reports whether any registered instance serves model.
func (rt *Router) HasModel(model string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, in := range rt.instances {
		if in.Model == model {
			return true
		}
	}
	return false
}

// Context is the largest context of model's instances (registered or
// departed) and their tokenizer ("" when they differ); 0 when none
// registered one.
func (rt *Router) Context(model string) (ctxLen int, tokenizerHash string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	mixed := false
	for _, m := range []map[string]Instance{rt.instances, rt.departed} {
		for _, in := range m {
			if in.Model != model || in.ContextLen <= 0 {
				continue
			}
			if ctxLen > 0 && in.TokenizerHash != tokenizerHash {
				mixed = true
			}
			ctxLen, tokenizerHash = max(ctxLen, in.ContextLen), in.TokenizerHash
		}
	}
	if mixed {
		tokenizerHash = ""
	}
	return ctxLen, tokenizerHash
}

// Knows reports whether any registration since the router started named
// model: a model whose instances are all restarting, or departed, is
// known; one nobody ever registered is not.
func (rt *Router) Knows(model string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.models[model]
}

// KnowsAny reports whether the router has seen any registration at all:
// before that, a cluster is still starting and no model can be told
// unknown.
func (rt *Router) KnowsAny() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.models) > 0
}

// Routable counts the instances Pick could choose now for some model:
// ready, not draining, not suppressed, not prefill-only.
func (rt *Router) Routable(now time.Time) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n := 0
	for _, in := range rt.instances {
		if in.Ready && !in.Draining && in.Role != "prefill" && !rt.suppressedLocked(in, now) {
			n++
		}
	}
	return n
}

// ReadyModels lists the models that a ready instance serves, sorted.
func (rt *Router) ReadyModels() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var models []string
	for _, in := range rt.instances {
		if in.Ready && !slices.Contains(models, in.Model) {
			models = append(models, in.Model)
		}
	}
	slices.Sort(models)
	return models
}

// Pick chooses a ready, not draining, not suppressed, not excluded
// instance of the model and revision (exclude: every generation of those
// instances). Instances with preferNumerics come first, so that a migrated
// request continues bit-exact where possible; then the least outstanding
// work; then the lowest id, for determinism.
func (rt *Router) Pick(model, revision, preferNumerics string, exclude map[string]bool, now time.Time) (Instance, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.pick(pickQuery{model: model, revision: revision, preferNumerics: preferNumerics, exclude: ExcludeAll(exclude), now: now,
		role: func(in Instance) bool { return in.Role != "prefill" }})
}

// Exclusion lists the endpoints a request failed on: each instance id up
// to a generation. A restart comes back at a higher generation, a new
// endpoint that is not excluded.
type Exclusion map[string]uint64

// ExcludeAll excludes every generation of the instances ids.
func ExcludeAll(ids map[string]bool) Exclusion {
	e := Exclusion{}
	for id, ok := range ids {
		if ok {
			e[id] = math.MaxUint64
		}
	}
	return e
}

func (e Exclusion) excludes(in Instance) bool {
	g, ok := e[in.ID]
	return ok && in.Generation <= g
}

// SummaryMaxAge is how old a node's prefix summary may be before the
// router ignores it.
const SummaryMaxAge = 5 * time.Second

// LoadWeight is how many cached prompt positions one outstanding sequence
// on an instance is worth: cache affinity never piles a hot prefix onto
// one busy instance.
const LoadWeight = 64

// CachedBlocks counts the leading keys that node's summary lists; fresh is
// false when the node has no summary younger than SummaryMaxAge.
func (rt *Router) CachedBlocks(node string, keys []blockid.BlockKey, now time.Time) (n int, fresh bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.cachedBlocks(node, keys, now)
}

func (rt *Router) cachedBlocks(node string, keys []blockid.BlockKey, now time.Time) (n int, fresh bool) {
	nd, ok := rt.nodes[node]
	if !ok || nd.Prefixes == nil || now.Sub(nd.Updated) > SummaryMaxAge {
		return 0, false
	}
	for _, k := range keys {
		if !nd.Prefixes[hex.EncodeToString(k[:8])] {
			break
		}
		n++
	}
	return n, true
}

// PickCached is Pick weighted by cached prefix: keysFor gives the keys of
// the request's prefix under an instance's KV identity (nil when they
// cannot be computed). An instance's score is its node's cached positions
// minus LoadWeight per outstanding sequence; stale or missing summaries
// score 0, which is load-only routing. It returns the pick, its cached
// blocks, and whether any summary was used. keysFor runs under the
// router's lock: it must not call the router.
func (rt *Router) PickCached(model, revision, preferNumerics string, exclude Exclusion, now time.Time,
	keysFor func(Instance) []blockid.BlockKey) (Instance, int, bool, error) {
	return rt.PickCachedBelow(model, revision, preferNumerics, exclude, now, keysFor, 0, "", false)
}

// PickCachedBelow is PickCached among the instances that hold fewer than
// below of this frontend's open streams (0: any): a re-route after an
// overload refusal goes only to an instance less loaded than the one that
// refused was; otherwise it would most likely refuse too, and the retry
// only amplify the load. A fresh request (no token out yet) also leaves
// out the instances at their capacity for its priority (what their
// workers hold, running and queued, all taken by this frontend's open
// streams): the worker would refuse it. Those left out count as full
// (ErrInstancesFull). A migration is left to the worker to queue or
// refuse.
func (rt *Router) PickCachedBelow(model, revision, preferNumerics string, exclude Exclusion, now time.Time,
	keysFor func(Instance) []blockid.BlockKey, below int, priority string, fresh bool) (Instance, int, bool, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cached := map[string]int{}
	used := false
	score := rt.cacheScore(keysFor, now, func(in Instance, n int) { used, cached[in.ID] = true, n })
	role := func(in Instance) bool { return in.Role != "prefill" }
	in, err := rt.pick(pickQuery{model: model, revision: revision, preferNumerics: preferNumerics, exclude: exclude, now: now,
		role: role, score: score, below: below, priority: priority, fresh: fresh})
	return in, cached[in.ID], used, err
}

// PickPrefill chooses a prefill instance with the given numerics the same
// way: the node holding the longest prefix of the prompt (a shared system
// prompt is not computed again), weighted against load; keysFor may be
// nil (load only). keysFor runs under the router's lock.
func (rt *Router) PickPrefill(model, revision, numerics string, exclude Exclusion, now time.Time, keysFor func(Instance) []blockid.BlockKey) (Instance, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var score func(Instance) int
	if keysFor != nil {
		score = rt.cacheScore(keysFor, now, func(Instance, int) {})
	}
	return rt.pick(pickQuery{model: model, revision: revision, preferNumerics: numerics, exclude: exclude, now: now,
		role: func(in Instance) bool { return in.Role == "prefill" && in.NumericsID == numerics }, score: score})
}

// cacheScore scores an instance by its node's cached prefix positions
// minus LoadWeight per outstanding sequence; seen gets each instance's
// cached blocks when its node's summary is fresh.
func (rt *Router) cacheScore(keysFor func(Instance) []blockid.BlockKey, now time.Time, seen func(Instance, int)) func(Instance) int {
	return func(in Instance) int {
		keys := keysFor(in)
		if keys == nil || in.KVIdentity == nil {
			return -rt.loadLocked(in) * LoadWeight
		}
		n, fresh := rt.cachedBlocks(in.Node, keys, now)
		if fresh {
			seen(in, n)
		}
		return n*in.KVIdentity.BlockSize - rt.loadLocked(in)*LoadWeight
	}
}

// HasPrefill reports whether any prefill instance of the model is known.
func (rt *Router) HasPrefill(model string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, in := range rt.instances {
		if in.Role == "prefill" && in.Model == model {
			return true
		}
	}
	return false
}

// KVSources lists the KV transfer endpoints of live nodes (their agents
// hold a lease): first those of the given nodes, in order, then the rest
// by name; never the node skip (the destination looks there itself).
func (rt *Router) KVSources(first []string, skip string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	seen := map[string]bool{skip: true}
	var out []string
	add := func(name string) {
		if n, ok := rt.nodes[name]; ok && !seen[name] && n.KVAddr != "" {
			seen[name] = true
			out = append(out, n.KVAddr)
		}
	}
	for _, n := range first {
		add(n)
	}
	names := make([]string, 0, len(rt.nodes))
	for n := range rt.nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		add(n)
	}
	return out
}

// pickQuery is what a pick chooses among and by: ready instances of
// model (and revision, when set) that role accepts and exclude does not
// exclude, with fewer than below of this frontend's open streams (0:
// any) and, when fresh, below their capacity for priority; those of
// preferNumerics first, then by score (higher first), then by load.
type pickQuery struct {
	model, revision, preferNumerics string
	exclude                         Exclusion
	now                             time.Time
	role                            func(Instance) bool
	score                           func(Instance) int
	below                           int
	priority                        string
	fresh                           bool
}

// pick chooses by q; it runs under rt.mu.
func (rt *Router) pick(q pickQuery) (Instance, error) {
	model, revision, preferNumerics, exclude, now := q.model, q.revision, q.preferNumerics, q.exclude, q.now
	role, score, below, priority, fresh := q.role, q.score, q.below, q.priority, q.fresh
	var cands []Instance
	full := false
	for _, in := range rt.instances {
		if rt.suppressedLocked(in, now) {
			continue
		}
		if !in.Ready || in.Draining || exclude.excludes(in) || in.Model != model || (revision != "" && in.ModelRevision != revision) || !role(in) {
			continue
		}
		if rt.fullLocked(in, priority, now) || (below > 0 && rt.streams[in.ID] >= below) || (fresh && rt.atCapacityLocked(in, priority)) {
			full = true
			continue
		}
		cands = append(cands, in)
	}
	switch {
	case len(cands) == 0 && full:
		return Instance{}, ErrInstancesFull
	case len(cands) == 0:
		return Instance{}, ErrNoInstance
	}
	scores := map[string]int{}
	if score != nil {
		for _, in := range cands {
			scores[in.ID] = score(in)
		}
	}
	slices.SortFunc(cands, func(a, b Instance) int {
		am, bm := a.NumericsID == preferNumerics, b.NumericsID == preferNumerics
		switch {
		case am && !bm:
			return -1
		case bm && !am:
			return 1
		case scores[a.ID] != scores[b.ID]:
			return scores[b.ID] - scores[a.ID]
		case rt.loadLocked(a) != rt.loadLocked(b):
			return rt.loadLocked(a) - rt.loadLocked(b)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return cands[0], nil
}

package frontend

import (
	"encoding/hex"
	"errors"
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
}

// Router picks instances. It keeps its last view when the registry is
// unreachable; Replace reconciles from a full read. It is safe for
// concurrent use: the registry watch updates it while requests pick.
type Router struct {
	// SuppressFor is how long an instance that failed a request is avoided
	// by every request of this frontend (default 5 s). Set it before use.
	SuppressFor time.Duration

	mu         sync.Mutex
	instances  map[string]Instance
	suppressed map[string]suppression
	nodes      map[string]Node
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

// suppression avoids one endpoint: the instance at generations up to gen.
// A restart comes back at a higher generation, a new endpoint that is not
// suppressed.
type suppression struct {
	gen   uint64
	until time.Time
}

// NewRouter returns an empty router.
func NewRouter() *Router {
	return &Router{SuppressFor: 5 * time.Second, instances: map[string]Instance{}, suppressed: map[string]suppression{}, nodes: map[string]Node{}}
}

// Update records a registration (a watch put). An older generation than
// the one known is ignored: registrations only move forward.
func (rt *Router) Update(in Instance) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.update(in)
}

func (rt *Router) update(in Instance) {
	if cur, ok := rt.instances[in.ID]; ok && cur.Generation > in.Generation {
		return
	}
	rt.instances[in.ID] = in
}

// Remove drops an instance (a watch delete or a failure announcement).
func (rt *Router) Remove(id string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	delete(rt.instances, id)
}

// Replace reconciles with a full read of the registry.
func (rt *Router) Replace(all []Instance) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.instances = map[string]Instance{}
	for _, in := range all {
		rt.update(in)
	}
}

// Suppress avoids an endpoint (instance id at generations up to gen)
// locally for SuppressFor.
func (rt *Router) Suppress(id string, gen uint64, now time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.suppress(id, gen, now)
}

func (rt *Router) suppress(id string, gen uint64, now time.Time) {
	rt.suppressed[id] = suppression{gen: gen, until: now.Add(rt.SuppressFor)}
}

// Fail applies a failure of instance id at generations up to gen (0: the
// generation known): the instance is dropped unless a newer generation
// replaced it, and the endpoint is suppressed. It returns the generation
// it applied, so that a late notice about an older generation never
// touches the newer one.
func (rt *Router) Fail(id string, gen uint64, now time.Time) uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cur, known := rt.instances[id]
	if gen == 0 {
		gen = cur.Generation
	}
	if known && cur.Generation <= gen {
		delete(rt.instances, id)
	}
	rt.suppress(id, gen, now)
	return gen
}

// Instance is the registration of instance id, if it is registered.
func (rt *Router) Instance(id string) (Instance, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	in, ok := rt.instances[id]
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
// instance of the model and revision. Instances with preferNumerics come
// first, so that a migrated request continues bit-exact where possible;
// then the least outstanding work; then the lowest id, for determinism.
func (rt *Router) Pick(model, revision, preferNumerics string, exclude map[string]bool, now time.Time) (Instance, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.pick(model, revision, preferNumerics, exclude, now, func(in Instance) bool { return in.Role != "prefill" }, nil)
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
func (rt *Router) PickCached(model, revision, preferNumerics string, exclude map[string]bool, now time.Time,
	keysFor func(Instance) []blockid.BlockKey) (Instance, int, bool, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cached := map[string]int{}
	used := false
	score := rt.cacheScore(keysFor, now, func(in Instance, n int) { used, cached[in.ID] = true, n })
	in, err := rt.pick(model, revision, preferNumerics, exclude, now, func(in Instance) bool { return in.Role != "prefill" }, score)
	return in, cached[in.ID], used, err
}

// PickPrefill chooses a prefill instance with the given numerics the same
// way: the node holding the longest prefix of the prompt (a shared system
// prompt is not computed again), weighted against load; keysFor may be
// nil (load only). keysFor runs under the router's lock.
func (rt *Router) PickPrefill(model, revision, numerics string, exclude map[string]bool, now time.Time, keysFor func(Instance) []blockid.BlockKey) (Instance, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var score func(Instance) int
	if keysFor != nil {
		score = rt.cacheScore(keysFor, now, func(Instance, int) {})
	}
	return rt.pick(model, revision, numerics, exclude, now, func(in Instance) bool { return in.Role == "prefill" && in.NumericsID == numerics }, score)
}

// cacheScore scores an instance by its node's cached prefix positions
// minus LoadWeight per outstanding sequence; seen gets each instance's
// cached blocks when its node's summary is fresh.
func (rt *Router) cacheScore(keysFor func(Instance) []blockid.BlockKey, now time.Time, seen func(Instance, int)) func(Instance) int {
	return func(in Instance) int {
		keys := keysFor(in)
		if keys == nil || in.KVIdentity == nil {
			return -in.Outstanding * LoadWeight
		}
		n, fresh := rt.cachedBlocks(in.Node, keys, now)
		if fresh {
			seen(in, n)
		}
		return n*in.KVIdentity.BlockSize - in.Outstanding*LoadWeight
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

// pick runs under rt.mu.
func (rt *Router) pick(model, revision, preferNumerics string, exclude map[string]bool, now time.Time, role func(Instance) bool, score func(Instance) int) (Instance, error) {
	var cands []Instance
	for id, in := range rt.instances {
		if sup, ok := rt.suppressed[id]; ok {
			if !now.Before(sup.until) {
				delete(rt.suppressed, id)
			} else if in.Generation <= sup.gen {
				continue
			}
		}
		if !in.Ready || in.Draining || exclude[id] || in.Model != model || (revision != "" && in.ModelRevision != revision) || !role(in) {
			continue
		}
		cands = append(cands, in)
	}
	if len(cands) == 0 {
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
		case a.Outstanding != b.Outstanding:
			return a.Outstanding - b.Outstanding
		}
		return strings.Compare(a.ID, b.ID)
	})
	return cands[0], nil
}

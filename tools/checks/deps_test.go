package checks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is this repository's module path; rule patterns are relative to
// it unless they name another module.
const module = "github.com/lifeline-llm/lifeline"

// A depRule forbids the packages matching From (but not Except) to depend,
// directly or through any chain of imports, on packages matching Deny but
// not Allow. Patterns are package paths relative to the module (or
// full paths of other modules); a trailing "/..." matches the package and
// everything under it. ARCHITECTURE.md lists the same rules in prose.
type depRule struct {
	Why    string
	From   []string
	Except []string
	Deny   []string
	Allow  []string
}

// Node-side machinery that a frontend, which runs on any machine and holds
// no KV, must never link.
var nodeMachinery = []string{
	"agent", "ebpf/...", "shm/...", "kv", "kv/kvclient", "rdma",
	"decode", "decode/model", "decode/sched", "decode/kvcache", "decode/matmul", "decode/worker",
	"github.com/cilium/ebpf/...", "github.com/NVIDIA/go-nvml/...", "github.com/dgraph-io/badger/...",
}

var depRules = []depRule{
	{Why: "the frontend runs on any machine and holds no KV: it reads contracts, never the node",
		From: []string{"frontend/..."}, Deny: nodeMachinery},
	{Why: "the frontend's decisions are pure: the standard library and contract leaves only",
		From: []string{"frontend/route", "frontend/reqfsm"},
		Deny: []string{"...", "github.com/...", "go.etcd.io/...", "google.golang.org/...", "golang.org/...", "go.opentelemetry.io/...", "gopkg.in/..."},
		Allow: []string{"frontend/route", "frontend/reqfsm", "frontend/openai", "kv/blockid", "decode/wire", "agent/schema", "agent/controlapi", "frontend/sse",
			"google.golang.org/protobuf/..."}},
	{Why: "nodectl reads the agent's control API over its socket; it links none of the agent",
		From: []string{"agent/nodectl", "cmd/nodectl"}, Deny: nodeMachinery},
	{Why: "contracts are leaves: importing a schema, a client or block names costs no machinery",
		From: []string{"agent/schema", "agent/controlapi", "kv/blockid", "decode/workerclient", "decode/wire",
			"rdma/transferclient", "rdma/transferpb", "kv/kvpb", "frontend/sse", "frontend/openai"},
		Deny:  []string{"..."},
		Allow: []string{"agent/schema", "agent/controlapi", "kv/blockid", "decode/wire", "rdma/transferpb", "internal/frame", "internal/pki", "internal/private", "internal/quicdial"}},
	{Why: "the engine and worker sit below the agent and the frontend",
		From: []string{"decode/..."}, Deny: []string{"agent/...", "frontend/..."}},
	{Why: "a worker links the KV client, never the arena's owner: no Badger in a worker",
		From: []string{"decode/...", "kv/kvclient"}, Deny: []string{"kv", "rdma", "github.com/dgraph-io/badger/..."}},
	{Why: "node libraries return errors to the agent; they never reach up into it",
		From: []string{"kv/...", "ebpf/...", "rdma/...", "shm/..."}, Deny: []string{"agent/..."}},
	{Why: "the arena knows slots, not blocks",
		From: []string{"shm/..."}, Deny: []string{"kv/..."}},
	{Why: "libraries never reach up into mains, applications, test frameworks or tools",
		From: []string{"..."}, Except: []string{"cmd/...", "internal/app/...", "tests/...", "tools/..."},
		Deny: []string{"cmd/...", "internal/app/...", "tests/...", "tools/..."}},
	{Why: "applications (the local cluster, drills, load) run without the test frameworks",
		From: []string{"internal/app/..."}, Deny: []string{"cmd/...", "tests/...", "tools/..."}},
	{Why: "NVML's cgo is the lifeline binary's alone: the agent, its tests and every other program link without cgo",
		From: []string{"..."}, Except: []string{"cmd/lifeline", "agent/nvmlgpu"},
		Deny: []string{"agent/nvmlgpu", "github.com/NVIDIA/go-nvml/..."}},
	{Why: "test frameworks drive the binaries; they never link mains or tools",
		From: []string{"tests/..."}, Deny: []string{"cmd/...", "tools/..."}},
}

// match reports whether pkg matches pattern.
func match(pattern, pkg string) bool {
	full := pattern
	switch first := strings.SplitN(pattern, "/", 2)[0]; {
	case pattern == "...":
		full = module + "/..."
	case !strings.Contains(first, "."):
		full = module + "/" + pattern
	}
	if base, ok := strings.CutSuffix(full, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == full
}

func matchAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, pkg) })
}

// importGraph is every package's direct imports, as go list reports them
// for the build (tests excluded: a test may use anything).
type importGraph map[string][]string

// loadGraph lists the module's packages and their dependencies. overlay,
// when not empty, is a go list -overlay file (used to plant violations).
func loadGraph(t *testing.T, overlay string) importGraph {
	t.Helper()
	args := []string{"list", "-deps", "-json=ImportPath,Imports,Standard"}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := importGraph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
			Standard   bool
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if !p.Standard {
			g[p.ImportPath] = p.Imports
		}
	}
	return g
}

// chain returns the shortest import chain from pkg to a package that rule
// denies, or nil.
func (g importGraph) chain(pkg string, r depRule) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p] {
			if _, seen := prev[imp]; seen {
				continue
			}
			if _, ok := g[imp]; !ok {
				continue // the standard library
			}
			prev[imp] = p
			if matchAny(r.Deny, imp) && !matchAny(r.Allow, imp) {
				var c []string
				for at := imp; at != ""; at = prev[at] {
					c = append(c, strings.TrimPrefix(at, module+"/"))
				}
				slices.Reverse(c)
				return c
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

// violations checks every rule against every package of the module.
func (g importGraph) violations(rules []depRule) []string {
	var out []string
	for pkg := range g {
		if !match("...", pkg) {
			continue
		}
		for _, r := range rules {
			if !matchAny(r.From, pkg) || matchAny(r.Except, pkg) {
				continue
			}
			if c := g.chain(pkg, r); c != nil {
				out = append(out, fmt.Sprintf("%s (%s): %s", c[0], r.Why, strings.Join(c, " → ")))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestDependencyRules enforces the package layering of ARCHITECTURE.md.
func TestDependencyRules(t *testing.T) {
	g := loadGraph(t, "")
	if len(g) < 20 {
		t.Fatalf("go list found only %d packages", len(g))
	}
	for _, v := range g.violations(depRules) {
		t.Error(v)
	}
}

// TestDependencyRulesCatchAPlantedViolation adds, through a go list
// overlay (nothing is written into the tree), a file to the frontend that
// imports the node agent, and one to shm that imports kv, and expects both
// caught with the chain that causes them.
func TestDependencyRulesCatchAPlantedViolation(t *testing.T) {
	if testing.Short() {
		t.Skip("-short tier: lists the module twice more (make test runs it)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	plant := map[string]string{
		filepath.Join(root, "frontend", "zz_planted.go"):             "package frontend\n\nimport _ \"" + module + "/agent\"\n",
		filepath.Join(root, "shm", "zz_planted.go"):                  "package shm\n\nimport _ \"" + module + "/kv/blockid\"\n",
		filepath.Join(root, "decode", "sample", "zz_planted.go"):     "package sample\n\nimport _ \"" + module + "/kv\"\n",
		filepath.Join(root, "frontend", "route", "zz_planted.go"):    "package route\n\nimport _ \"github.com/prometheus/client_golang/prometheus\"\n",
		filepath.Join(root, "internal", "frame", "zz_planted.go"):    "package frame\n\nimport _ \"" + module + "/tests/cgtest\"\n",
		filepath.Join(root, "internal", "unixsock", "zz_planted.go"): "package unixsock\n\nimport _ \"github.com/NVIDIA/go-nvml/pkg/nvml\"\n",
	}
	replace := map[string]string{}
	for path, src := range plant {
		f := filepath.Join(dir, filepath.Base(filepath.Dir(path))+".go")
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[path] = f
	}
	overlay := filepath.Join(dir, "overlay.json")
	b, _ := json.Marshal(map[string]any{"Replace": replace})
	if err := os.WriteFile(overlay, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got := loadGraph(t, overlay).violations(depRules)
	want := []string{
		"frontend (the frontend runs on any machine and holds no KV: it reads contracts, never the node): frontend → agent",
		"shm (the arena knows slots, not blocks): shm → kv/blockid",
		"decode/sample (a worker links the KV client, never the arena's owner: no Badger in a worker): decode/sample → kv",
		"internal/frame (libraries never reach up into mains, applications, test frameworks or tools): internal/frame → tests/cgtest",
		"frontend/route (the frontend's decisions are pure: the standard library and contract leaves only): frontend/route → github.com/prometheus/client_golang/prometheus",
		"internal/unixsock (NVML's cgo is the lifeline binary's alone: the agent, its tests and every other program link without cgo): internal/unixsock → github.com/NVIDIA/go-nvml/pkg/nvml",
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("planted violation not reported: %s\ngot:\n%s", w, strings.Join(got, "\n"))
		}
	}
	// The frontend's violation reaches other packages through it (the
	// client tests' importers, cmd): every reported chain must pass
	// through a planted edge.
	for _, v := range got {
		if !strings.Contains(v, "frontend → agent") && !strings.Contains(v, "shm → kv/blockid") && !strings.Contains(v, "decode/sample → kv") &&
			!strings.Contains(v, "internal/frame → tests/cgtest") && !strings.Contains(v, "frontend/route → github.com/prometheus") &&
			!strings.Contains(v, "internal/unixsock → github.com/NVIDIA/go-nvml") {
			t.Errorf("unexpected violation: %s", v)
		}
	}
}

// TestMatch pins the pattern language of depRule.
func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"agent", module + "/agent", true},
		{"agent", module + "/agent/schema", false},
		{"agent/...", module + "/agent/schema", true},
		{"agent/...", module + "/agentx", false},
		{"...", module + "/shm", true},
		{"...", "github.com/cilium/ebpf", false},
		{"github.com/cilium/ebpf/...", "github.com/cilium/ebpf/link", true},
		{"github.com/dgraph-io/badger/...", "github.com/dgraph-io/badger/v4", true},
	} {
		if got := match(c.pattern, c.pkg); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.pkg, got, c.want)
		}
	}
}

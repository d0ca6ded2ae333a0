// Package deploy holds the systemd unit, the example configuration and
// the Prometheus alerting rules; its tests keep them in line with what
// the agent accepts and the metrics the processes export.
package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/agent"
)

func TestExampleConfigValidates(t *testing.T) {
	var o agent.Options
	if err := agent.LoadFile("agent.example.json", &o); err != nil {
		t.Fatal(err)
	}
	o.Socket = "/run/lifeline/agent.sock"
	o.Defaults()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestUnitKeepsWorkersAcrossRestarts(t *testing.T) {
	b, err := os.ReadFile("lifeline-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "KillMode=process", "TimeoutStopSec=", "--check-config"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("unit lacks %q", want)
		}
	}
}

// TestPrometheusRules: the alerting rules load (promtool check rules),
// pass their unit tests (promtool test rules: each alert fires on the
// series that should fire it, not on healthy ones), and name only
// metrics this repository exports. promtool is Debian's prometheus
// package: without it the test is skipped, but not in CI
// (LIFELINE_CI), which installs it.
func TestPrometheusRules(t *testing.T) {
	rules, err := os.ReadFile("prometheus/lifeline-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, m := range regexp.MustCompile(`lifeline_[a-z_]+`).FindAllString(string(rules), -1) {
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")
		if !exported[name] {
			t.Errorf("the rules name %s, which nothing here exports", m)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("promtool is not installed (CI installs Debian's prometheus package)")
		}
		t.Skip("promtool is not installed (apt-get install prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "lifeline-rules.yml"}, {"test", "rules", "lifeline-rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// exportedMetrics are the metric names quoted in the repository's Go
// files (where they are registered).
func exportedMetrics(t *testing.T) map[string]bool {
	names := map[string]bool{}
	quoted := regexp.MustCompile(`"(lifeline_[a-z_]+)"`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range quoted.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

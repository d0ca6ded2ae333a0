package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunnableDocCommands runs every shell block of the README and the
// docs marked <!-- runnable --> against a `lifeline up` like make run's
// (2 nodes, 2 frontends, the small model), as written but for the
// frontends' ports: each must succeed, and a streamed curl must end with
// [DONE]. A README whose commands rot fails here.
func TestRunnableDocCommands(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var blocks []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, runnableBlocks(string(b))...)
	}
	if len(blocks) < 2 {
		t.Fatalf("%d runnable blocks in the README and docs: the quickstart's are marked <!-- runnable -->", len(blocks))
	}
	// Each frontend on a port the kernel picks (as TestUpTLS).
	up := startUp(t, t.TempDir(), "--nodes", "2", "--frontends", "2", "--preset", "small", "--listen", "127.0.0.1:0")
	var urls []string
	for _, l := range strings.Split(up.out.String(), "\n") {
		if u, ok := strings.CutPrefix(l, "URL "); ok {
			urls = append(urls, u)
		}
	}
	if len(urls) != 2 {
		t.Fatalf("lifeline up printed %d URLs:\n%s", len(urls), up.out.String())
	}
	for _, b := range blocks {
		cmd := strings.NewReplacer("http://127.0.0.1:8080", urls[0], "http://127.0.0.1:8081", urls[1]).Replace(b)
		c := exec.Command("sh", "-ec", cmd)
		c.Dir = root
		out, err := c.CombinedOutput()
		if err != nil || strings.Contains(cmd, "curl -N") && !strings.Contains(string(out), "[DONE]") {
			t.Errorf("%s\n: %v\n%s", b, err, out)
		}
	}
}

// runnableBlocks are the ```sh blocks of doc that follow a line
// <!-- runnable -->.
func runnableBlocks(doc string) []string {
	var out []string
	lines := strings.Split(doc, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "<!-- runnable -->" {
			continue
		}
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j >= len(lines) || strings.TrimSpace(lines[j]) != "```sh" {
			continue
		}
		var b []string
		for j++; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
			b = append(b, lines[j])
		}
		out = append(out, strings.Join(b, "\n"))
	}
	return out
}

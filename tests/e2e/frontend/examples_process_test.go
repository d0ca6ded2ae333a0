package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/tests/binaries"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestResumeExamples runs the Chat Completions resume recipes users copy,
// examples/resume-go (the official Go SDK) and examples/resume-node (the
// official Node SDK), as their READMEs say: each streams from frontend A,
// A is SIGKILLed mid-stream, and the example resumes at B and prints
// exactly what a fault-free run prints. The Node one needs node and npm
// (the SDK is installed from npm): without them it is skipped, but not in
// CI (LIFELINE_CI), which installs them.
func TestResumeExamples(t *testing.T) {
	t.Parallel()
	proctest.Processes(t)
	root := moduleRoot(t)
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "resume-go"), "./examples/resume-go")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go example: %v\n%s", err, out)
	}
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	b := clustertest.StartFrontend(t, n, "--id", "B")
	args := []string{"-model", "tiny", "-max-tokens", "400", "-seed", "5", "-ignore-eos", "-prompt", "Once upon a time"}
	examples := map[string]func(urls string) *exec.Cmd{
		"go": func(urls string) *exec.Cmd {
			return exec.Command(filepath.Join(dir, "resume-go"), append([]string{"-urls", urls}, args...)...)
		},
		"node": func(urls string) *exec.Cmd {
			node := append([]string{"resume.mjs", "--urls", urls}, dashdash(args)...)
			cmd := exec.Command("node", node...)
			cmd.Dir = nodeExample(t, root, dir)
			return cmd
		},
	}
	for _, name := range []string{"go", "node"} {
		t.Run(name, func(t *testing.T) {
			want, err := examples[name](b).Output()
			if err != nil || len(want) < 100 {
				t.Fatalf("fault-free run: %v, %d bytes out\n%s", err, len(want), stderrOf(err))
			}
			a := clustertest.StartFrontendProc(t, n, "--id", "A-"+name)
			cmd := examples[name](a.URL + "," + b)
			var out, errb proctest.SyncBuffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			proctest.WaitFor(t, 20*time.Second, "the example printing", func() (bool, string) {
				return len(out.String()) >= 40, fmt.Sprintf("%d bytes", len(out.String()))
			})
			a.Signal(syscall.SIGKILL)
			<-a.Exited()
			if err := cmd.Wait(); err != nil {
				t.Fatalf("the example after A's death: %v\n%s", err, errb.String())
			}
			if got := out.String(); got != string(want) {
				t.Fatalf("printed %q\nwant %q\nstderr: %s", got, want, errb.String())
			}
			if !strings.Contains(errb.String(), "resuming at "+b) {
				t.Fatalf("the example did not resume at B: %s", errb.String())
			}
		})
	}
}

// dashdash turns the Go flags into the Node example's (--flag).
func dashdash(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if strings.HasPrefix(a, "-") {
			out[i] = "-" + a
		}
	}
	return out
}

// nodeExample is a copy of examples/resume-node with its dependencies
// installed (npm ci, from its lock file), or the test is skipped without
// node (failed in CI).
func nodeExample(t *testing.T, root, dir string) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("LIFELINE_CI") != "" {
				t.Fatalf("%s is not installed (CI installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	to := filepath.Join(dir, "resume-node")
	if _, err := os.Stat(filepath.Join(to, "node_modules")); err == nil {
		return to
	}
	os.MkdirAll(to, 0o755)
	for _, f := range []string{"resume.mjs", "package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "resume-node", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(to, f), b, 0o644)
	}
	ci := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	ci.Dir = to
	if out, err := ci.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	return to
}

func moduleRoot(t *testing.T) string {
	root, err := binaries.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

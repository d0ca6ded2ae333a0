// Package proctest is what process tests share: the real binaries, built
// once per test binary and only when a test asks for them; the tier
// switch (process tests are not in `go test -short`); and one WaitFor
// that polls a condition with a deadline instead of sleeping and hoping.
package proctest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/binaries"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildTags are the build tags of this test binary that the binaries are
// built with too (tags.go files): a test built with -tags llamacpp runs a
// lifeline that has llama.cpp.
var buildTags []string

// BinariesEnv names a directory that holds lifeline and nodectl built
// from this tree: `make test` builds them once and passes it to every
// package, whose process tests then run those instead of building their
// own. A test binary built with tags (-tags llamacpp) ignores it and
// builds binaries with its tags.
const BinariesEnv = "LIFELINE_TEST_BINARIES"

// given is set when the binaries came from BinariesEnv (Main leaves them).
var given bool

// checkGiven says what is missing from a BinariesEnv directory.
func checkGiven(dir string) error {
	for _, name := range []string{"lifeline", "nodectl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("proctest: %s=%s: %w (build both there: go build -o %s/ ./cmd/lifeline ./cmd/nodectl, or unset it)", BinariesEnv, dir, err, dir)
		}
	}
	return nil
}

// build compiles cmd/lifeline and cmd/nodectl into a temporary directory,
// or takes them from BinariesEnv.
func build() {
	if dir := os.Getenv(BinariesEnv); dir != "" && len(buildTags) == 0 {
		if buildErr = checkGiven(dir); buildErr == nil {
			binDir, given = dir, true
		}
		return
	}
	if binDir, buildErr = os.MkdirTemp("", "lifeline-bin-"); buildErr == nil {
		_, buildErr = binaries.Build(binDir, buildTags...)
	}
}

// Processes marks t as a process test: it is skipped in the -short tier.
func Processes(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("process test: not in the -short tier")
	}
}

func binary(t testing.TB, name string) string {
	t.Helper()
	Processes(t)
	buildOnce.Do(build)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, name)
}

// Lifeline returns the path of the lifeline binary, building it on first
// use. It marks t as a process test.
func Lifeline(t testing.TB) string { t.Helper(); return binary(t, "lifeline") }

// Nodectl returns the path of the nodectl binary, building it on first use.
func Nodectl(t testing.TB) string { t.Helper(); return binary(t, "nodectl") }

// MainParallel is Main with up to n of the package's parallel tests
// run at once unless -parallel says otherwise: go test's default is
// GOMAXPROCS, and a package whose process tests mostly wait on timers,
// leases and processes leaves the CPUs idle at 2.
func MainParallel(m *testing.M, n int) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
	Main(m)
}

// Main runs the package's tests and removes the binaries afterwards; call
// it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binDir != "" && !given {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// Run runs the lifeline binary with args and returns its output.
func Run(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(Lifeline(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// WaitFor polls cond until it returns true or timeout passes, then fails t
// with what it waited for and cond's last word. The poll interval starts
// at 5 ms and doubles up to 100 ms.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (ok bool, last string)) {
	t.Helper()
	if last, ok := Poll(timeout, cond); !ok {
		t.Fatalf("timed out after %v waiting for %s (last: %s)", timeout, what, last)
	}
}

// Poll is WaitFor for callers that must not fail the test from where they
// run (a goroutine): it reports whether cond came true in time, and cond's
// last word.
func Poll(timeout time.Duration, cond func() (ok bool, last string)) (string, bool) {
	deadline := time.Now().Add(timeout)
	interval := 5 * time.Millisecond
	for {
		ok, last := cond()
		if ok {
			return last, true
		}
		if time.Now().After(deadline) {
			return last, false
		}
		time.Sleep(interval)
		interval = min(2*interval, 100*time.Millisecond)
	}
}

// Never asserts that cond stays false for d, polling it: the bounded way
// to show that something did not happen (a negative needs some window;
// this names it and checks throughout it rather than once at its end).
func Never(t testing.TB, d time.Duration, what string, cond func() (happened bool, detail string)) {
	t.Helper()
	if detail, happened := Poll(d, cond); happened {
		t.Fatalf("%s happened: %s", what, detail)
	}
}

// SyncBuffer is a bytes.Buffer safe for a process writing while a test
// reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitLine reads r until a line contains want (up to 30 s) and returns
// that line; the rest of r is drained in the background.
func WaitLine(t testing.TB, r io.Reader, want string) string {
	t.Helper()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stream ended before %q", want)
			}
			if strings.Contains(l, want) {
				go func() {
					for range lines {
					}
				}()
				return l
			}
		case <-timeout:
			t.Fatalf("no line with %q within 30s", want)
		}
	}
}

// FreeTCPAddr returns a loopback address with a port free at the time of
// the call.
func FreeTCPAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ProcessesMentioning lists live (not zombie) processes whose command
// line contains s, as "pid: command line".
func ProcessesMentioning(s string) []string {
	var out []string
	for _, p := range procfs.Mentioning(s) {
		out = append(out, fmt.Sprintf("%d: %s", p.PID, strings.Join(p.Args(), " ")))
	}
	return out
}

// WorkerPIDs lists the live worker processes whose command line names
// sock (a node's KV socket, so the workers of one node).
func WorkerPIDs(sock string) []int {
	var pids []int
	for _, p := range procfs.Mentioning(sock) {
		if strings.Contains(p.Cmdline, "worker\x00") {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// JSONLines decodes out, one JSON value of type T per line (the output of
// `lifeline engine generate --json`, of `nodectl events`).
func JSONLines[T any](t testing.TB, out string) []T {
	t.Helper()
	var vs []T
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		vs = append(vs, v)
	}
	return vs
}

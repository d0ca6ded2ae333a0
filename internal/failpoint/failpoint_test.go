package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestActions runs this test binary as a child with failpoints armed, so
// that "kill" really kills a process.
func TestActions(t *testing.T) {
	if name := os.Getenv("FAILPOINT_CHILD"); name != "" {
		err := Hit(name)
		if errors.Is(err, ErrInjected) {
			os.Exit(3)
		}
		os.Exit(0)
	}
	for _, c := range []struct {
		armed, hit string
		exit       int
		signalled  bool
	}{
		{"a=error", "a", 3, false},
		{"a=error", "b", 0, false},
		{"a=kill", "a", -1, true},
		{"a=sleep:10ms", "a", 0, false},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestActions$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD="+c.hit, EnvVar+"="+c.armed)
		out, _ := cmd.CombinedOutput()
		st := cmd.ProcessState
		if c.signalled {
			if st.ExitCode() != -1 || !strings.Contains(string(out), "failpoint a hit") {
				t.Errorf("%s: exit %v, output %q", c.armed, st, out)
			}
			continue
		}
		if st.ExitCode() != c.exit {
			t.Errorf("%s hit %s: exit %d, want %d", c.armed, c.hit, st.ExitCode(), c.exit)
		}
	}
}

func TestCheckRejectsTypos(t *testing.T) {
	for _, v := range []string{"kv.before-seal", "kv.before-seal=explode", "=pause", "a=sleep:2h", "a=sleep:x", "a=sleep:-1s"} {
		armed, parseE = nil, nil
		t.Setenv(EnvVar, v)
		load()
		if parseE == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

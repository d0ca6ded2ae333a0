package proctest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	last, ok := Poll(time.Second, func() (bool, string) { n++; return n == 3, "third" })
	if !ok || last != "third" || n != 3 {
		t.Fatalf("Poll: ok %v, last %q after %d calls", ok, last, n)
	}
	start := time.Now()
	if _, ok := Poll(50*time.Millisecond, func() (bool, string) { return false, "" }); ok {
		t.Fatal("Poll reported a condition that never held")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("Poll gave up after %v, before its timeout", d)
	}
}

// TestGivenBinariesChecked: a BinariesEnv directory without the binaries
// is refused with what to do; one with both is taken.
func TestGivenBinariesChecked(t *testing.T) {
	dir := t.TempDir()
	err := checkGiven(dir)
	if err == nil || !strings.Contains(err.Error(), BinariesEnv) || !strings.Contains(err.Error(), "go build -o") {
		t.Fatalf("empty directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lifeline"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkGiven(dir); err == nil || !strings.Contains(err.Error(), "nodectl") {
		t.Fatalf("without nodectl: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nodectl"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkGiven(dir); err != nil {
		t.Fatalf("both there: %v", err)
	}
}

package ebpf

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

func TestGeneratedCodeIsFresh(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("exit.c")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile("exit.c.sha256")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	if got := strings.Fields(string(rec)); len(got) == 0 || got[0] != hex.EncodeToString(sum[:]) {
		t.Fatal("exit.c changed since exit_bpfel.o was generated: run `make generate` (needs clang) and commit the result")
	}
}

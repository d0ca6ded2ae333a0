package localcluster

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// TestScanLinesDrainsPastALongLine: a line longer than any buffer stops
// the scan of a child's log but not the draining of its pipe: the writer
// is never left blocked, and what followed is passed on whole.
func TestScanLinesDrainsPastALongLine(t *testing.T) {
	pr, pw := io.Pipe()
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(pw, "first\n"+strings.Repeat("x", 2*maxLogLine)+"\nlast\n")
		pw.Close()
		wrote <- err
	}()
	var lines []string
	var rest bytes.Buffer
	done := make(chan struct{})
	go func() {
		scanLines(pr, func(l string) { lines = append(lines, l) }, &rest)
		close(done)
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer of a long line was left blocked on its pipe")
	}
	<-done
	if len(lines) != 1 || lines[0] != "first" || !strings.HasSuffix(rest.String(), "\nlast\n") {
		t.Fatalf("lines %q, then %d bytes ending %q", lines, rest.Len(), rest.String()[max(0, rest.Len()-8):])
	}
}

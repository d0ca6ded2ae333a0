package main

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
)

// waitLine reads r until a line contains want or the deadline passes; the
// rest of r is drained in the background.
func waitLine(t *testing.T, r io.Reader, want string) string {
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

package debugsock

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServedOnAPrivateSocket: the pages are served on a socket of mode
// 0600 and read back through its base; a page that is not there is an
// error.
func TestServedOnAPrivateSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "debug.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	Mount(mux, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[]")) }))
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })

	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v (%v), want a socket of mode 0600", fi.Mode(), err)
	}
	base := Base(path)
	if b, err := Get(context.Background(), base, "/debug/pprof/goroutine?debug=1", 1<<20); err != nil || !strings.Contains(string(b), "goroutine profile") {
		t.Fatalf("goroutines: %v %.80q", err, b)
	}
	if b, err := Get(context.Background(), base, "/debug/traces", 1<<20); err != nil || string(b) != "[]" {
		t.Fatalf("traces: %v %q", err, b)
	}
	if _, err := Get(context.Background(), base, "/metrics", 1<<20); err == nil {
		t.Fatal("a page the socket does not serve was read")
	}
	if _, err := Get(context.Background(), Base(path+".absent"), "/debug/traces", 1<<20); err == nil {
		t.Fatal("a socket that is not there was read")
	}
}

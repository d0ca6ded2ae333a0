// Package debugsock serves a process's debug pages — its goroutines,
// heap and CPU profiles, and its recent trace spans — on a unix socket
// that only its user (and root) can connect to, and reads them back.
//
// The pages name request ids, models, token counts, stacks and the
// cluster's topology: they are nobody else's business, so they never
// share the loopback metrics port, which every local user can reach,
// with /metrics. A debug base is written "unix:PATH"; with curl:
//
//	curl --unix-socket PATH http://debug/debug/traces
package debugsock

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/lifeline-llm/lifeline/internal/unixsock"
)

// Scheme prefixes a debug base: "unix:" and the socket's path.
const Scheme = "unix:"

// Mount registers the debug pages on mux: /debug/pprof/goroutine (by
// stack with ?debug=1, for a leak's name), heap (?gc=1 collects first:
// what is live), allocs, profile (?seconds=N), and /debug/traces when
// traces is not nil.
func Mount(mux *http.ServeMux, traces http.Handler) {
	if traces != nil {
		mux.Handle("GET /debug/traces", traces)
	}
	mux.Handle("GET /debug/pprof/goroutine", pprof.Handler("goroutine"))
	mux.Handle("GET /debug/pprof/heap", pprof.Handler("heap"))
	mux.Handle("GET /debug/pprof/allocs", pprof.Handler("allocs"))
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
}

// Listen binds the socket at path, mode 0600 from its first moment.
func Listen(path string) (*unixsock.Listener, error) {
	ln, err := unixsock.Listen(path, 0o600)
	if err != nil {
		return nil, fmt.Errorf("debug socket: %w", err)
	}
	return ln, nil
}

// Base is the debug base of the socket at path.
func Base(path string) string { return Scheme + path }

// Client is an HTTP client of the debug base and the URL prefix its
// requests take: for "unix:PATH" a client dialling PATH; for an http(s)
// base (a page served elsewhere, in tests), the default client.
func Client(base string) (*http.Client, string) {
	path, ok := strings.CutPrefix(base, Scheme)
	if !ok {
		return http.DefaultClient, strings.TrimSuffix(base, "/")
	}
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		// One request each: nothing is left open on the process.
		DisableKeepAlives: true,
	}}, "http://debug"
}

// Get reads page (a path and query, "/debug/pprof/heap?gc=1") of the
// debug base, at most limit bytes of it; any status but 200 is an error.
func Get(ctx context.Context, base, page string, limit int64) ([]byte, error) {
	c, prefix := Client(base)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prefix+page, nil)
	if err != nil {
		return nil, fmt.Errorf("debug: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("debug: %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("debug: %s%s: %s", base, page, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("debug: %s%s: %w", base, page, err)
	}
	return body, nil
}

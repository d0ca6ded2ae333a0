package drill

import "testing"

func TestParseGoroutineStacks(t *testing.T) {
	text := `goroutine profile: total 5
3 @ 0x1 0x2
#	0x1	runtime.gopark+0x1	/x/proc.go:1
#	0x2	net/http.(*conn).serve+0x2	/x/server.go:2

2 @ 0x3
#	0x3	main.loop+0x3	/x/main.go:3
`
	got := parseGoroutineStacks(text)
	want := map[string]int{"runtime.gopark < net/http.(*conn).serve": 3, "main.loop": 2}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	before := processes{stacks: map[string]map[string]int{"u": {"main.loop": 2}}}
	after := processes{stacks: map[string]map[string]int{"u": got}}
	if more := moreGoroutines(before, after); len(more) != 1 || more[0] != "u +3 runtime.gopark < net/http.(*conn).serve" {
		t.Fatalf("moreGoroutines = %q", more)
	}
}

func TestOfOurs(t *testing.T) {
	for stack, want := range map[string]bool{
		"runtime.gopark < github.com/lifeline-llm/lifeline/frontend.(*run).loop":                                  true,
		"github.com/quic-go/quic-go.(*Conn).run":                                                                  false,
		"internal/poll.runtime_pollWait < net.(*conn).Read < github.com/lifeline-llm/lifeline/kv.serveConn":       false,
		"github.com/quic-go/quic-go.(*Conn).AcceptStream < github.com/lifeline-llm/lifeline/rdma.(*Engine).Serve": false,
		// Parked on a connection below a frame of ours that waits on
		// something else first: still ours.
		"runtime.gopark < github.com/lifeline-llm/lifeline/x.wait < internal/poll.runtime_pollWait < github.com/lifeline-llm/lifeline/y.read": true,
	} {
		if got := ofOurs(stack); got != want {
			t.Errorf("ofOurs(%q) = %v, want %v", stack, got, want)
		}
	}
}

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

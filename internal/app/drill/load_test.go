package drill

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestSteadyBacksOffWhileRefused: with no frontend listening every run is
// refused at once; a steady load tries again after a doubling pause, not
// thousands of times a second, and records each refusal.
func TestSteadyBacksOffWhileRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	l := NewLoad(&Cluster{URLs: []string{url}, Model: "tiny"}, LoadSpec{Streams: 2, MaxTokens: 8})
	defer l.Close()
	stop := l.Steady(context.Background())
	time.Sleep(time.Second) // the window the runs are counted over
	runs := stop()
	for _, s := range runs {
		if s.Err == nil || len(s.Tokens) != 0 {
			t.Fatalf("a run against a closed port: %d tokens, error %v", len(s.Tokens), s.Err)
		}
	}
	// Two streams, pauses of 10, 20, 40 … 500 ms: about 7 runs each in a
	// second; a hot loop makes thousands.
	if len(runs) < 2 || len(runs) > 30 {
		t.Fatalf("%d refused runs in a second from 2 streams, want 2..30", len(runs))
	}
	t.Logf("%d refused runs in a second from 2 streams", len(runs))
}

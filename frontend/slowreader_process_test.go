package frontend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/localcluster/clustertest"
	"github.com/lifeline-llm/lifeline/internal/overload"
	"github.com/lifeline-llm/lifeline/internal/proctest"
)

// TestSlowReaderIsCutAndResumes: a client (HTTP/2, a 64 KiB stream
// window) stops reading a resumable stream while its tokens keep coming.
// The frontend holds nothing for it but the log: its heap grows by no
// more than the log's tokens meanwhile (a follower buffering the events
// it cannot write would hold several times as much). Once a write has
// waited the write timeout the frontend closes the stream (counted), the
// request runs on, and the client resumes by Last-Event-ID: the rest,
// identical to an uninterrupted run, no gap, no duplicate.
func TestSlowReaderIsCutAndResumes(t *testing.T) {
	proctest.Processes(t)
	t.Parallel()
	const writeTimeout, tokens, readFirst = 2 * time.Second, 2000, 10
	n := clustertest.NewNode(t, clustertest.SmallDecode(1))
	n.WaitRegistration(t, "n1-decode-small-0", 0)
	url := clustertest.StartFrontend(t, n, "--write-timeout", writeTimeout.String())
	metrics := clustertest.MetricsURL(t, url)
	body := map[string]any{"model": "small", "prompt": "A slow reader", "max_tokens": tokens, "temperature": 0.9, "seed": 11,
		"stream": true, "ignore_eos": true, "stream_options": map[string]any{"resumable": true}}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	if len(want) != tokens {
		t.Fatalf("reference run: %d tokens, want %d", len(want), tokens)
	}

	tr := &http.Transport{Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10}}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	b, _ := json.Marshal(body)
	resp, err := (&http.Client{Transport: tr}).Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", resp.Proto)
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	first := clustertest.ReadSSE(t, resp.Body, func(tok clustertest.Token) bool { return tok.Seq == readFirst })
	stalled := time.Now() // the client reads nothing more
	before := heapAfterGC(t, metrics)
	var after map[string]float64
	proctest.WaitFor(t, 60*time.Second, "the stalled client cut by the write timeout", func() (bool, string) {
		after = heapAfterGC(t, metrics)
		return after["lifeline_frontend_slow_clients_closed_total"] >= 1, fmt.Sprintf("%.0f tokens logged", after["lifeline_frontend_tokens_total"])
	})
	if took := time.Since(stalled); took < writeTimeout {
		t.Fatalf("the stalled client was cut %v after it stopped reading, before the write timeout %v", took, writeTimeout)
	}
	// The log's share: a Token and its text, about 80 bytes; a buffered
	// event is about 300 more.
	grew, logged := after["go_memstats_heap_inuse_bytes"]-before["go_memstats_heap_inuse_bytes"],
		after["lifeline_frontend_tokens_total"]-before["lifeline_frontend_tokens_total"]
	t.Logf("stalled: the heap grew %.0f bytes while %.0f tokens were logged", grew, logged)
	if bound := 256<<10 + 120*logged; grew > bound {
		t.Fatalf("the frontend's heap grew %.0f bytes while a stalled client's stream logged %.0f tokens (bound %.0f): something buffers for it", grew, logged, bound)
	}

	req, _ := http.NewRequest("GET", url+"/v1/streams/"+id, nil)
	req.Header.Set("Last-Event-ID", "10")
	req.Header.Set("Authorization", "Bearer "+token)
	rresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rresp.Body.Close()
	if rresp.StatusCode != http.StatusOK {
		t.Fatalf("resume after the cut: status %d", rresp.StatusCode)
	}
	got := append(first[:readFirst:readFirst], clustertest.ReadSSE(t, rresp.Body, nil)...)
	if len(got) != len(want) {
		t.Fatalf("resumed after the cut: %d tokens, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Seq != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d after the cut and resume: %+v, want %+v", i+1, got[i], want[i])
		}
	}
}

// heapAfterGC collects the frontend's garbage and returns its metrics,
// with the heap in use the least of three collect-then-scrape rounds:
// what a round reads also counts the garbage of writing the heap profile
// and of the scrape itself, which swung a single sample by over 1 MB
// either way here (-1.4 MB over a stall that logged 624 tokens); the
// least of three is the live heap's.
func heapAfterGC(t *testing.T, metrics string) map[string]float64 {
	t.Helper()
	var m map[string]float64
	least := math.Inf(1)
	for range 3 {
		resp, err := http.Get(metrics + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if m, err = overload.Scrape(context.Background(), metrics); err != nil {
			t.Fatal(err)
		}
		least = min(least, m["go_memstats_heap_inuse_bytes"])
	}
	m["go_memstats_heap_inuse_bytes"] = least
	return m
}

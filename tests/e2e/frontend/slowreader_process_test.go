package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/app/overload"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestSlowReaderIsCutAndResumes: a client (HTTP/2, a 64 KiB stream
// window) stops reading a resumable stream while its tokens keep coming.
// The frontend holds nothing for it but the log: its live heap grows by
// no more than the log's tokens meanwhile (a follower buffering the events
// it cannot write would hold about 350 bytes a token more). Once a write
// has waited the write timeout the frontend closes the stream (counted),
// the request runs on, and the client resumes by Last-Event-ID: the rest,
// identical to an uninterrupted run, no gap, no duplicate.
//
// The write timeout is set from the worker's rate in the reference run,
// so that about stallTokens are logged while the client stalls on any
// machine: enough for a buffering follower's share to stand above the
// constant slack of the bound.
func TestSlowReaderIsCutAndResumes(t *testing.T) {
	proctest.Processes(t)
	t.Parallel()
	const tokens, readFirst, stallTokens = 2000, 10, 1000
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	body := map[string]any{"model": "tiny", "prompt": "A slow reader", "max_tokens": tokens, "temperature": 0.9, "seed": 11,
		"stream": true, "ignore_eos": true, "stream_options": map[string]any{"resumable": true}}
	began := time.Now()
	want, _ := clustertest.StreamCompletion(t, clustertest.StartFrontend(t, n), body, nil)
	if len(want) != tokens {
		t.Fatalf("reference run: %d tokens, want %d", len(want), tokens)
	}
	rate := float64(tokens) / time.Since(began).Seconds()
	writeTimeout := min(max(time.Duration(stallTokens/rate*float64(time.Second)), 2*time.Second), 10*time.Second).Round(time.Millisecond)
	t.Logf("reference run: %.0f tokens/s: write timeout %v", rate, writeTimeout)
	url := clustertest.StartFrontend(t, n, "--write-timeout", writeTimeout.String())
	metrics, debug := clustertest.MetricsURL(t, url), clustertest.Debug(t, url)

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
	before := heapAfterGC(t, debug, metrics)
	var after map[string]float64
	proctest.WaitFor(t, 60*time.Second, "the stalled client cut by the write timeout", func() (bool, string) {
		after = heapAfterGC(t, debug, metrics)
		return after["lifeline_frontend_slow_clients_closed_total"] >= 1, fmt.Sprintf("%.0f tokens logged", after["lifeline_frontend_tokens_total"])
	})
	if took := time.Since(stalled); took < writeTimeout {
		t.Fatalf("the stalled client was cut %v after it stopped reading, before the write timeout %v", took, writeTimeout)
	}
	// The log's share: a token's id, where its text ends and the text,
	// 12-30 bytes with the slices' spare room; a buffered event is about
	// 350 more. The slack is what the rest of the frontend holds live at
	// one moment and not another (pools, the etcd client's buffers):
	// 25-44 KB in six runs here, over about 1,300 tokens.
	grew, logged := after["go_gc_heap_live_bytes"]-before["go_gc_heap_live_bytes"],
		after["lifeline_frontend_tokens_total"]-before["lifeline_frontend_tokens_total"]
	t.Logf("stalled: the live heap grew %.0f bytes while %.0f tokens were logged", grew, logged)
	if bound := 128<<10 + 100*logged; grew > bound {
		t.Fatalf("the frontend's live heap grew %.0f bytes while a stalled client's stream logged %.0f tokens (bound %.0f): something buffers for it", grew, logged, bound)
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
// with go_gc_heap_live_bytes (what that collection found live, which the
// scrape's own garbage does not change) the least of three
// collect-then-scrape rounds: a collection the runtime started by itself
// in between may count a little of what was allocated while it marked.
func heapAfterGC(t *testing.T, debug, metrics string) map[string]float64 {
	t.Helper()
	var m map[string]float64
	least := math.Inf(1)
	for range 3 {
		var err error
		if m, err = overload.ScrapeAfterGC(context.Background(), debug, metrics); err != nil {
			t.Fatal(err)
		}
		live, ok := m["go_gc_heap_live_bytes"]
		if !ok {
			t.Fatal("the frontend exports no go_gc_heap_live_bytes")
		}
		least = min(least, live)
	}
	m["go_gc_heap_live_bytes"] = least
	return m
}

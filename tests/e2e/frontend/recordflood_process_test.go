package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestRecordFloodCannotFillEtcd: clients flooding streamed requests whose
// records are as large as a record may be cannot raise etcd's no-space
// alarm (which stops every write of the cluster: leases, generations,
// registrations). etcd runs with a 48 MiB quota and its history
// compacted every 2 s, the frontend with an 8 MiB record budget: the
// flood is refused with a retryable 503 records_full once the budget is
// spent, a record over the per-record bound is a 400 naming stop, and
// etcd takes writes throughout. On the old code (no budget, no
// compaction, a record over the bound served without one) the alarm rose
// within seconds.
func TestRecordFloodCannotFillEtcd(t *testing.T) {
	t.Parallel()
	env := clustertest.NewEnvWith(t, localcluster.EnvOptions{EtcdCompaction: 2 * time.Second, EtcdQuotaBytes: 48 << 20})
	n := clustertest.StartNode(t, env, "n1")
	n.WaitWorkerReady(t)
	url := clustertest.StartFrontend(t, n, "--record-bytes-max", fmt.Sprint(8<<20))

	post := func(stop []string) (int, string, string) {
		b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 2, "stream": true, "stop": stop})
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			return 0, "", err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Code, Param string }
		}
		json.Unmarshal(body, &e)
		return resp.StatusCode, e.Error.Code, e.Error.Param
	}
	// One record over the bound: four stop strings of 70 KB.
	if status, code, param := post(strings.Split(strings.Repeat(strings.Repeat("y", 70_000)+",", 4)[:4*70_001-1], ",")); status != 400 || code != "request_record_too_large" || param != "stop" {
		t.Fatalf("a record over the bound: %d %s %s, want 400 request_record_too_large on stop", status, code, param)
	}
	// The flood: records of about 240 KB, eight clients, 15 s.
	stop := strings.Split(strings.Repeat(strings.Repeat("z", 60_000)+",", 4)[:4*60_001-1], ",")
	var served, full, other atomic.Int64
	var lastOther atomic.Value
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				switch status, code, _ := post(stop); {
				case status == 200:
					served.Add(1)
				case status == 503 && code == "records_full":
					full.Add(1)
				default:
					other.Add(1)
					lastOther.Store(fmt.Sprintf("%d %s", status, code))
				}
			}
		})
	}
	alarms := func() []*pb.AlarmMember {
		actx, acancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer acancel()
		resp, err := env.Client.AlarmList(actx)
		if err != nil {
			t.Errorf("alarm list: %v", err)
			return nil
		}
		return resp.Alarms
	}
	var raised []*pb.AlarmMember
	for ctx.Err() == nil && len(raised) == 0 {
		raised = alarms()
		time.Sleep(500 * time.Millisecond)
	}
	wg.Wait()
	var db int64
	if st, err := env.Client.Status(t.Context(), env.Endpoints[0]); err == nil {
		db = st.DbSize
	}
	t.Logf("flood: %d served, %d refused records_full, %d other (%v); etcd db %d bytes", served.Load(), full.Load(), other.Load(), lastOther.Load(), db)
	if len(raised) > 0 {
		t.Fatalf("etcd raised %v under the flood", raised)
	}
	if served.Load() == 0 || full.Load() == 0 || other.Load() > 0 {
		t.Fatalf("flood: %d served, %d records_full, %d other (%v): want some served, the rest refused records_full", served.Load(), full.Load(), other.Load(), lastOther.Load())
	}
	if _, err := env.Client.Put(t.Context(), "/lifeline/v1/test/after-flood", "ok"); err != nil {
		t.Fatalf("etcd refuses a write after the flood: %v", err)
	}
	if m := clustertest.Metrics(t, url); !strings.Contains(m, "lifeline_frontend_request_record_bytes_live") {
		t.Fatal("no lifeline_frontend_request_record_bytes_live metric")
	}
}

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestStoppedFrontendLeavesNoRecord: a frontend stopped with SIGTERM
// takes its record (what draining agents wait for) with it before it
// exits. Its keep-alive once forgot the lease as the frontend stopped, so
// nothing revoked it: the record stayed its 5 s TTL, and every drain
// meanwhile waited its whole settle bound for a frontend that was gone.
func TestStoppedFrontendLeavesNoRecord(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	f := clustertest.StartFrontendProc(t, n)
	records := func() int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := n.Env.Client.Get(ctx, schema.FrontendsPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	proctest.WaitFor(t, 10*time.Second, "the frontend's record", func() (bool, string) {
		c := records()
		return c == 1, fmt.Sprintf("%d records", c)
	})
	f.Stop(10 * time.Second)
	if st := f.ExitState(); st != "exit status 0" {
		t.Fatalf("the frontend ended with %q", st)
	}
	if c := records(); c != 0 {
		t.Fatalf("%d frontend records left once the frontend exited", c)
	}
}

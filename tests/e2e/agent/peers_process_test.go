package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestAgentsDialPeersAheadOfNeed: two agents hold a connection to each
// other's transfer endpoint from the node records alone, before any pull;
// when one agent is killed the other's connection goes, and when it is
// back the other dials it again.
func TestAgentsDialPeersAheadOfNeed(t *testing.T) {
	proctest.Processes(t)
	t.Parallel()
	m1, m2 := proctest.FreeTCPAddr(t), proctest.FreeTCPAddr(t)
	n1 := clustertest.NewNode(t, func(o *clustertest.Config) { o.Metrics = m1 })
	n2 := clustertest.Peer(t, n1, "n2", func(o *clustertest.Config) { o.Metrics = m2 })
	const warm = "lifeline_agent_kv_transfer_peers_warm "
	waitWarm := func(addr string, want int, within time.Duration) {
		t.Helper()
		proctest.WaitFor(t, within, fmt.Sprintf("%s%d at %s", warm, want, addr), func() (bool, string) {
			page, err := tryScrape(addr)
			if err != nil {
				return false, err.Error()
			}
			line := grepLines(page, warm)
			return strings.TrimSpace(line) == fmt.Sprintf("%s%d", warm, want), line
		})
	}
	waitWarm(m1, 1, 15*time.Second)
	waitWarm(m2, 1, 15*time.Second)
	if page := scrape(t, m1); !strings.Contains(page, "lifeline_agent_kv_transfer_pulls_ok_total 0") {
		t.Fatalf("connections came from a pull, not ahead of one:\n%s", grepLines(page, "lifeline_agent_kv_transfer_pulls"))
	}
	// The QUIC keep-alive stops being answered: the connection times out.
	n2.Process().Kill()
	<-n2.Exited()
	waitWarm(m1, 0, 20*time.Second)
	n2.Restart(t)
	waitWarm(m1, 1, 20*time.Second)
}

// tryScrape is scrape for a listener that may be away.
func tryScrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

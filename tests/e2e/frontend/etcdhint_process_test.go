package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestFrontendStartErrorsSayWhatToDo: a frontend whose identity has no
// etcd user, or whose certificates come from another CA, exits within
// seconds saying what fixes it — the etcd-setup command for its name, or
// both CAs — instead of retrying "permission denied" or "unknown
// authority" for 30 s and being restarted to do it again.
func TestFrontendStartErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	env := clustertest.NewEnv(t)
	ghost := filepath.Join(t.TempDir(), "ghost")
	if err := pki.Issue(env.CA, ghost, pki.Frontend("ghost"), nil); err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.InitIdentity(t.TempDir(), pki.Frontend("stranger"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, certs string
		want        []string
	}{
		{"no etcd user", ghost, []string{"refused frontend:ghost", "lifeline certs etcd-setup --etcd " + env.Endpoints[0], "--frontend ghost"}},
		{"another CA", stranger, []string{"presents a certificate issued by", "lifeline cluster CA", "trusts only"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, proctest.Lifeline(t), "frontend", "--listen", "127.0.0.1:0", "--etcd", strings.Join(env.Endpoints, ","), "--etcd-tls", "--certs", c.certs)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			if err == nil || ctx.Err() != nil || took > 15*time.Second {
				t.Fatalf("frontend: %v after %v:\n%s", err, took, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Fatalf("frontend said:\n%s\nwant it to say %q", out, w)
				}
			}
			t.Logf("exited after %v: %s", took.Round(time.Millisecond), strings.TrimSpace(string(out))[max(0, len(out)-400):])
		})
	}
}

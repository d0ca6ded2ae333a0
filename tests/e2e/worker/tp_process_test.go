package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// tpGroup is a tensor-parallel group of `lifeline worker --rank r`
// processes started as its agent would: a collective segment per group
// generation, every rank with --group-generation.
type tpGroup struct {
	segment string
	ranks   []*exec.Cmd
	exited  []chan struct{}
	client  *workerclient.Client
}

func startTPGroup(t *testing.T, tp int, gen uint64) *tpGroup {
	t.Helper()
	bin := proctest.Lifeline(t)
	root := t.TempDir()
	certs, err := pki.InitIdentity(root, pki.Worker("test", "w"))
	if err != nil {
		t.Fatal(err)
	}
	clientCerts, err := pki.InitIdentity(root, pki.Frontend("test"))
	if err != nil {
		t.Fatal(err)
	}
	g := &tpGroup{segment: filepath.Join(root, "group")}
	if err := collective.Create(g.segment, tp, gen, 4096*384); err != nil {
		t.Fatal(err)
	}
	var addr string
	for r := 0; r < tp; r++ {
		cmd := exec.Command(bin, "worker", "--instance-id", "w", "--generation", "1", "--preset", "small", "--certs", certs,
			"--listen", "127.0.0.1:0", "--tp", fmt.Sprint(tp), "--rank", fmt.Sprint(r), "--group-segment", g.segment,
			"--group-generation", fmt.Sprint(gen))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-exited })
		g.ranks, g.exited = append(g.ranks, cmd), append(g.exited, exited)
		lines := bufio.NewReader(out)
		if r == 0 {
			// Rank 0's ready line comes once every rank joined.
			defer func() {
				line, err := lines.ReadBytes('\n')
				var ready workerclient.Ready
				if err != nil || json.Unmarshal(line, &ready) != nil || ready.Addr == "" {
					t.Fatalf("rank 0's ready line %q: %v", line, err)
				}
				addr = ready.Addr
				go io.Copy(io.Discard, lines)
				tlsConf, err := workerclient.ClientTLS(clientCerts)
				if err != nil {
					t.Fatal(err)
				}
				if g.client, err = workerclient.Dial(context.Background(), addr, tlsConf, "w", 1); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.client.Close() })
			}()
			continue
		}
		go io.Copy(io.Discard, lines)
	}
	return g
}

// generate streams one seeded request and returns its tokens.
func (g *tpGroup) generate(t *testing.T, id string, seed uint64, n int, prefix []int32) ([]int32, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := g.client.Generate(ctx, &wire.Generate{RequestId: id, Prompt: "Once upon a time there was", MaxTokens: int32(n),
		Temperature: 0.9, TopP: 0.95, Seed: seed, IgnoreEos: true, PrefixTokens: prefix})
	if err != nil {
		return nil, err
	}
	toks := slices.Clone(prefix)
	for {
		f, err := s.Next()
		if err == io.EOF {
			return toks, nil
		}
		if err != nil {
			return toks, err
		}
		if f.Error != nil {
			return toks, fmt.Errorf("%s: %s", f.Error.Code, f.Error.Message)
		}
		if f.FinishReason == "" && f.SequenceNo > 0 {
			toks = append(toks, f.TokenId)
		}
	}
}

// TestTP2GroupsAreBitExactWithEachOther: two tp=2 groups of `lifeline
// worker` processes serve the same seeded streams bit-identically, alone
// or four at once (batch composition), and a stream continued on the
// second group from a random token k of the first's output (the
// migration's prefix) is the first's, from k on.
func TestTP2GroupsAreBitExactWithEachOther(t *testing.T) {
	a, b := startTPGroup(t, 2, 1), startTPGroup(t, 2, 1)
	const n = 40
	ref, err := a.generate(t, "ref", 7, n, nil)
	if err != nil || len(ref) != n {
		t.Fatalf("group a: %d tokens, %v", len(ref), err)
	}
	var wg sync.WaitGroup
	got := make([][]int32, 4)
	errs := make([]error, 4)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seed := uint64(7)
			if i > 0 {
				seed = uint64(100 + i) // other streams in the same batches
			}
			got[i], errs[i] = b.generate(t, fmt.Sprint("b", i), seed, n, nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("group b stream %d: %v", i, err)
		}
	}
	if !slices.Equal(got[0], ref) {
		t.Fatalf("group b in a batch of 4 served %v, group a alone %v", got[0], ref)
	}
	k := 1 + rand.IntN(n-2) // a random point of the stream (logged)
	t.Logf("continuing from token %d", k)
	cont, err := b.generate(t, "cont", 7, n, ref[:k])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cont, ref) {
		t.Fatalf("continued on b from %d: %v, want %v", k, cont, ref)
	}
}

// TestTPRankDeathEndsTheGroup: SIGKILL rank 1 of a tp=2 group mid-stream;
// its death (seen as its agent sees it, the process's exit) aborts the
// segment: the stream ends with an error, never hangs, and rank 0 exits
// (the group aborted) well within a second. A rank started for another
// group generation is refused at once.
func TestTPRankDeathEndsTheGroup(t *testing.T) {
	g := startTPGroup(t, 2, 3)
	done := make(chan error, 1)
	go func() {
		_, err := g.generate(t, "long", 1, 3000, nil)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // decoding by now
	g.ranks[1].Process.Signal(syscall.SIGKILL)
	<-g.exited[1]
	seen := time.Now()
	if err := collective.AbortSegment(g.segment); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the stream completed although rank 1 died")
		}
		t.Logf("the stream ended %v after the death was seen: %v", time.Since(seen), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream still runs 10 s after rank 1 died")
	}
	select {
	case <-g.exited[0]:
		t.Logf("rank 0 exited %v after the death was seen (%s)", time.Since(seen), g.ranks[0].ProcessState)
	case <-time.After(time.Second):
		g.ranks[0].Process.Signal(syscall.SIGQUIT) // its goroutines, on stderr
		<-g.exited[0]
		t.Fatal("rank 0 still runs a second after its group was aborted")
	}
	if g.ranks[0].ProcessState.Success() {
		t.Fatal("rank 0 of an aborted group exited 0")
	}
	// A rank for group generation 2 on the generation-3 segment.
	stale := exec.Command(proctest.Lifeline(t), "worker", "--instance-id", "w", "--generation", "1", "--preset", "tiny",
		"--tp", "2", "--rank", "1", "--group-segment", g.segment, "--group-generation", "2")
	out, err := stale.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "stale group generation") {
		t.Fatalf("a stale rank: %v: %s", err, out)
	}
}

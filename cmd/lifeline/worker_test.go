package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// startWorker runs `lifeline worker` with a certificate of instance (on
// node "test") issued by the CA in ca, and returns its Ready line.
func startWorker(t *testing.T, ca, instance string, gen uint64, extra ...string) (*exec.Cmd, workerclient.Ready) {
	t.Helper()
	certs := clustertest.Issue(t, ca, "worker", "test/"+instance)
	cmd := exec.Command(proctest.Lifeline(t), append([]string{"worker", "--instance-id", instance, "--generation", fmt.Sprint(gen), "--certs", certs}, extra...)...)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	ready := make(chan workerclient.Ready, 1)
	go func() {
		var r workerclient.Ready
		if json.NewDecoder(bufio.NewReader(out)).Decode(&r) == nil {
			ready <- r
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case r := <-ready:
		return cmd, r
	case <-time.After(30 * time.Second):
		t.Fatal("worker never became ready")
	}
	return nil, workerclient.Ready{}
}

// TestWorkerServesOverMutualTLS: the worker process streams the same
// tokens as the engine command, stamped with its instance and generation;
// a client with an unknown certificate is refused; frames of an older
// generation than the client expects are dropped and counted.
func TestWorkerServesOverMutualTLS(t *testing.T) {
	t.Parallel()
	ca := clustertest.CADir(t)
	_, ready := startWorker(t, ca, "decode-7", 3)
	certs := clustertest.Issue(t, ca, "frontend", "client")
	if ready.Generation != 3 || ready.NumericsID == "" {
		t.Fatalf("ready line %+v", ready)
	}
	tlsConf, err := workerclient.ClientTLS(certs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := workerclient.Dial(ctx, ready.Addr, tlsConf, "decode-7", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Health(ctx)
	if err != nil || !h.Ready || h.ModelRevision != ready.ModelRevision {
		t.Fatalf("health %+v %v", h, err)
	}
	s, err := c.Generate(ctx, &wire.Generate{RequestId: "r1", RequestEpoch: 1, Prompt: "Once upon a time", MaxTokens: 30,
		Temperature: 0.9, TopP: 0.9, TopK: 40, Seed: 42, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	frames := clustertest.CollectFrames(t, s)
	out, _, err := proctest.Run(t, "engine", "generate", "--preset", "tiny", "--prompt", "Once upon a time", "--seed", "42",
		"--temperature", "0.9", "--top-p", "0.9", "--top-k", "40", "--max-tokens", "30", "--ignore-eos", "--json")
	if err != nil {
		t.Fatal(err)
	}
	want := parseLines(t, out)
	if len(frames) != 31 || frames[30].FinishReason != "length" {
		t.Fatalf("%d frames, last %+v", len(frames), frames[len(frames)-1])
	}
	for i, l := range want {
		f := frames[i]
		if int(f.SequenceNo) != l.SequenceNo || int(f.TokenId) != l.TokenID || f.Text != l.Text || f.Generation != 3 || f.InstanceId != "decode-7" || f.RequestEpoch != 1 {
			t.Fatalf("frame %d = %+v, want %+v", i, f, l)
		}
	}
	// Bad input is a typed error frame, and the worker keeps serving.
	s, _ = c.Generate(ctx, &wire.Generate{RequestId: "bad", Prompt: "", MaxTokens: 5})
	if fs := clustertest.CollectFrames(t, s); len(fs) != 1 || fs[0].Error.GetCode() != wire.Code_INVALID_REQUEST {
		t.Fatalf("empty prompt: %+v", fs)
	}
	// A client that expects generation 4 drops generation-3 frames.
	newer, err := workerclient.Dial(ctx, ready.Addr, tlsConf, "decode-7", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	s, _ = newer.Generate(ctx, &wire.Generate{RequestId: "r2", Prompt: "hi", MaxTokens: 3, IgnoreEos: true})
	if fs := clustertest.CollectFrames(t, s); len(fs) != 0 || newer.StaleFrames() != 4 {
		t.Fatalf("stale generation: %d frames delivered, %d dropped", len(fs), newer.StaleFrames())
	}
	// A client with another CA's certificate cannot connect.
	other, err := workerclient.ClientTLS(clustertest.CertDir(t))
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	if oc, err := workerclient.Dial(short, ready.Addr, other, "decode-7", 3); err == nil {
		if _, err := oc.Health(short); err == nil {
			t.Fatal("a client with a foreign certificate was served")
		}
		oc.Close()
	}
}

package agent

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// TestWorkerArgsParseBack: the command line the agent spawns a worker with
// parses, through the worker's flag set, to the instance's settings. The
// worker gets its own certificate directory, never the agent's (which
// holds the node CA's key).
func TestWorkerArgsParseBack(t *testing.T) {
	a := &Agent{opts: Options{CertDir: "/etc/lifeline/certs", DataDir: "/var/lib/lifeline", BindAddress: "127.0.0.1"}, kvSocket: "/var/lib/lifeline/kv.sock", kvAddr: "10.0.0.1:7100"}
	inst := &instance{id: "n1-prefill-small-2", spec: InstanceSpec{Role: "prefill", Preset: "small", WeightSeed: 5, MaxRunning: 3, MaxQueued: 6,
		DraftLayers: 2, DraftK: 5}}
	argv := a.workerArgs(inst, 12).Argv()
	var got workerclient.Args
	fs := pflag.NewFlagSet(workerclient.Command, pflag.ContinueOnError)
	got.AddFlags(fs)
	if err := fs.Parse(argv); err != nil {
		t.Fatalf("parse %q: %v", argv, err)
	}
	want := workerclient.Args{InstanceID: "n1-prefill-small-2", Generation: 12, Role: "prefill", Listen: "127.0.0.1:0", CertDir: "/var/lib/lifeline/workers/n1-prefill-small-2",
		Preset: "small", WeightSeed: 5, KVSocket: "/var/lib/lifeline/kv.sock", KVTransfer: "10.0.0.1:7100", MaxRunning: 3, MaxQueued: 6,
		DraftLayers: 2, DraftK: 5}
	if got != want {
		t.Errorf("worker argv %q parses to\n %+v, want\n %+v", argv, got, want)
	}
}

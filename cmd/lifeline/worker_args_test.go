package main

import (
	"context"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/worker"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// TestWorkerArgvRoundTrip: the command line the node agent builds for a
// worker parses, through `lifeline worker`'s own flags, to the options it
// describes.
func TestWorkerArgvRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args workerclient.Args
		want worker.Options
	}{
		{"agent defaults",
			workerclient.Args{InstanceID: "n1-decode-tiny-0", Generation: 3, Role: "decode", Listen: "127.0.0.1:0", CertDir: "/certs",
				Preset: "tiny", WeightSeed: 1, KVSocket: "/data/kv.sock", KVTransfer: "127.0.0.1:7100"},
			worker.Options{InstanceID: "n1-decode-tiny-0", Generation: 3, Role: "decode", Listen: "127.0.0.1:0", CertDir: "/certs",
				KVTransfer: "127.0.0.1:7100", Engine: decode.Options{Preset: "tiny", WeightSeed: 1, KVSocket: "/data/kv.sock"}}},
		{"every flag",
			workerclient.Args{InstanceID: "n2-prefill-small-1", Generation: 1 << 40, Role: "prefill", Listen: "10.0.0.2:9000", CertDir: "/c",
				Preset: "small", WeightSeed: 77, ModelPath: "/m/model.bin", TokenizerPath: "/m/tokenizer.bin", KVSocket: "/k.sock",
				KVTransfer: "10.0.0.2:9100", MaxRunning: 4, MaxQueued: 12, DraftPreset: "tiny", DraftK: 6, StepInterval: 7 * time.Millisecond},
			worker.Options{InstanceID: "n2-prefill-small-1", Generation: 1 << 40, Role: "prefill", Listen: "10.0.0.2:9000", CertDir: "/c",
				KVTransfer: "10.0.0.2:9100", Engine: decode.Options{Preset: "small", WeightSeed: 77, ModelPath: "/m/model.bin",
					TokenizerPath: "/m/tokenizer.bin", KVSocket: "/k.sock", DraftPreset: "tiny", DraftK: 6, StepInterval: 7 * time.Millisecond,
					Limits: sched.Limits{MaxRunning: 4, MaxQueued: 12, MaxStepTokens: sched.DefaultLimits.MaxStepTokens}}}},
		{"self-draft",
			workerclient.Args{InstanceID: "i", Generation: 1, Role: "decode", Listen: "127.0.0.1:0", Preset: "small", WeightSeed: 1, DraftLayers: 2},
			worker.Options{InstanceID: "i", Generation: 1, Role: "decode", Listen: "127.0.0.1:0",
				Engine: decode.Options{Preset: "small", WeightSeed: 1, DraftLayers: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *worker.Options
			cmd := newWorkerCmd(func(_ context.Context, o worker.Options, _ io.Writer) error { got = &o; return nil })
			cmd.SetArgs(tc.args.Argv())
			cmd.SetOut(io.Discard)
			if err := cmd.Execute(); err != nil {
				t.Fatalf("lifeline worker %q: %v", tc.args.Argv(), err)
			}
			if got == nil || got.Log == nil {
				t.Fatalf("lifeline worker %q: options %+v, no log", tc.args.Argv(), got)
			}
			got.Log = nil // the command's logger: JSON lines to stderr
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("lifeline worker %q:\n got %+v\nwant %+v", tc.args.Argv(), got, tc.want)
			}
		})
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/decode/worker"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestMigrationOfAFinishedRequestFinishes: the decode worker serving a
// request dies after the frame of its last token and before its finish
// frame (a failpoint, armed on both nodes, kills a worker exactly there
// when it generated tokens), so the frontend holds every token and no
// end. The request migrates to the other node with a prefix that already
// ended it — a stop token, a closed JSON value — which finishes it at
// once, generating nothing:
// the client sees finish_reason stop and the full output, never an
// invalid_request error (a recoverable failure must not surface as a
// client error).
func TestMigrationOfAFinishedRequestFinishes(t *testing.T) {
	t.Parallel()
	armed := func(c *clustertest.Config) {
		c.ExtraEnv = append(c.ExtraEnv, "LIFELINE_FAILPOINTS="+worker.FailBeforeFinish+"=kill")
	}
	n1 := clustertest.NewNode(t, clustertest.PacedDecode(1), armed)
	n2 := clustertest.Peer(t, n1, "n2", clustertest.PacedDecode(1), armed)
	nodes := map[string]*clustertest.Node{"n1-decode-tiny-0": n1, "n2-decode-tiny-0": n2}
	gens := map[string]uint64{}
	for id, n := range nodes {
		gens[id] = n.WaitRegistration(t, id, 0).Generation
	}
	url := clustertest.StartFrontend(t, n1)
	eos := tokenizer.NewBuiltin().EOS()
	for _, tc := range []struct {
		name  string
		body  map[string]any
		check func(text string) error
	}{
		{"stop token", map[string]any{"model": "tiny", "prompt": "Once", "max_tokens": 8, "stream": true,
			"logit_bias": map[string]any{fmt.Sprint(eos): 100}}, func(string) error { return nil }},
		// A schema whose value closes well within max_tokens (an enum),
		// so that the close, not the budget, ends it.
		{"closed json value", map[string]any{"model": "tiny", "prompt": "Answer in JSON:", "max_tokens": 48, "stream": true,
			"temperature": 0.9, "seed": 3, "response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{
				"name": "pick", "schema": map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"enum": []string{"yes", "no"}}},
					"required": []string{"a"}, "additionalProperties": false}}}},
			func(text string) error {
				if !json.Valid([]byte(text)) {
					return fmt.Errorf("%q is not JSON", text)
				}
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks, last := clustertest.StreamCompletion(t, url, tc.body, nil)
			var text strings.Builder
			for _, tok := range toks {
				text.WriteString(tok.Text)
			}
			if len(toks) == 0 || nodes[toks[0].Instance] == nil {
				t.Fatalf("no token from a known worker: %+v", toks)
			}
			first := toks[0].Instance
			if _, failed := last["error"]; failed {
				t.Fatalf("the client got an error: %v", last)
			}
			choices, _ := last["choices"].([]any)
			ll, _ := last["lifeline"].(map[string]any)
			if len(choices) != 1 || choices[0].(map[string]any)["finish_reason"] != "stop" {
				t.Fatalf("end chunk %v, want finish_reason stop; text %q", last, text.String())
			}
			if m, _ := ll["migrations"].(float64); m < 1 {
				t.Fatalf("the armed worker did not die before its finish frame (migrations %v): %v", ll["migrations"], last)
			}
			if err := tc.check(text.String()); err != nil {
				t.Fatal(err)
			}
			// The failpoint kills every worker that generated a token here
			// before its finish frame, so the worker that finished the
			// request generated nothing. Tokens from another instance mean
			// that the first one's last frames died with it, queued but not
			// yet sent (a loaded machine): the next worker generated them
			// again and was killed before its finish in turn, so the
			// request must have moved at least twice.
			for i, tok := range toks {
				if tok.Instance == first {
					continue
				}
				if m, _ := ll["migrations"].(float64); m < 2 {
					t.Fatalf("a token came from %s after %s died and the request moved only %v times: the continuation that finished generated", tok.Instance, first, m)
				}
				t.Logf("tokens %d.. came from %s: %s's last frames were lost with it", i+1, tok.Instance, first)
				break
			}
			// The killed worker is back (a new generation) before the next
			// case.
			gens[first] = nodes[first].WaitRegistration(t, first, gens[first]).Generation
		})
	}
}

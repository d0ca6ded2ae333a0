package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// The Responses API through the official Go SDK: create (whole, streamed,
// in the background), retrieve (whole, and streamed after a sequence
// number), cancel, delete, input items, previous_response_id, a
// json_schema format and a function call; the refusals; and background
// streams that survive their frontend's SIGKILL, their worker's, and
// both, resumed with retrieve(stream, starting_after) at another
// frontend, event for event identical to a fault-free run.

// sdk is an SDK client of the frontend at url with API key key.
func sdk(url, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// respEvent is what a test compares of an event: its type, sequence
// number and text.
type respEvent struct {
	Type  string
	Seq   int64
	Delta string
	ID    string // the response's, on response.created
}

// readEvents reads a response stream until it ends (or stop says so: the
// stream is left open), returning its events, the final response (if a
// terminal event came) and the stream's error.
func readEvents(s *ssestream.Stream[responses.ResponseStreamEventUnion], stop func(respEvent) bool) ([]respEvent, *responses.Response, error) {
	var evs []respEvent
	var final *responses.Response
	for s.Next() {
		e := s.Current()
		ev := respEvent{Type: e.Type, Seq: e.SequenceNumber, Delta: e.Delta}
		if e.Type == "response.created" {
			ev.ID = e.Response.ID
		}
		if e.Type == "error" {
			return evs, final, fmt.Errorf("error event: %s: %s", e.Code, e.Message)
		}
		evs = append(evs, ev)
		switch e.Type {
		case "response.completed", "response.incomplete", "response.failed":
			r := e.Response
			final = &r
		}
		if stop != nil && stop(ev) {
			return evs, final, nil
		}
	}
	return evs, final, s.Err()
}

// checkEvents: sequence numbers contiguous from first, one terminal event
// at the end.
func checkEvents(evs []respEvent, first int64) error {
	for i, e := range evs {
		if e.Seq != first+int64(i) {
			return fmt.Errorf("event %d (%s) has sequence number %d, want %d", i, e.Type, e.Seq, first+int64(i))
		}
	}
	return nil
}

func joined(evs []respEvent) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == "response.output_text.delta" {
			b.WriteString(e.Delta)
		}
	}
	return b.String()
}

// story is a seeded response body of n tokens.
func story(seed, n int, background bool) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: "tiny", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("Story number %d began when", seed))},
		MaxOutputTokens: openai.Int(int64(n)), Temperature: openai.Float(0.9), Instructions: openai.String("tell stories")}
	if background {
		p.Background = openai.Bool(true)
	}
	return p
}

func seedOpt(seed int) []option.RequestOption {
	return []option.RequestOption{option.WithJSONSet("seed", seed), option.WithJSONSet("ignore_eos", true)}
}

// errText is an SDK error with its body.
func errText(err error) string {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.Error() + " " + ae.RawJSON()
	}
	return fmt.Sprint(err)
}

// statusOf is the HTTP status of an SDK error (0: none).
func statusOf(err error) int {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return 0
}

func TestResponsesSDK(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	a := clustertest.StartFrontend(t, n, "--id", "A")
	b := clustertest.StartFrontend(t, n, "--id", "B")
	ca, cb := sdk(a, "k1"), sdk(b, "k1")
	ca2, cb2 := sdk(a, "k2"), sdk(b, "k2")
	ctx := context.Background()

	// Whole, streamed, retrieved: the same output for the same seed.
	p := story(3, 12, false)
	p.Metadata = shared.Metadata{"user": "u1"}
	whole, err := ca.Responses.New(ctx, p, seedOpt(3)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(whole.ID, "resp_") || whole.Status != "incomplete" || whole.IncompleteDetails.Reason != "max_output_tokens" ||
		whole.Usage.OutputTokens != 12 || whole.Usage.InputTokens < 2 || whole.OutputText() == "" || whole.Metadata["user"] != "u1" ||
		whole.Instructions.OfString != "tell stories" || whole.Model != "tiny" {
		t.Fatalf("whole response: %s", whole.RawJSON())
	}
	evs, final, err := readEvents(ca.Responses.NewStreaming(ctx, p, seedOpt(3)...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkEvents(evs, 0); err != nil {
		t.Fatal(err)
	}
	wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for i, typ := range wantTypes {
		if evs[i].Type != typ {
			t.Fatalf("event %d: %s, want %s", i, evs[i].Type, typ)
		}
	}
	tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	for i, typ := range tail {
		if got := evs[len(evs)-len(tail)+i].Type; got != typ {
			t.Fatalf("event %d from the end: %s, want %s", len(tail)-i, got, typ)
		}
	}
	if joined(evs) != whole.OutputText() || final == nil || final.OutputText() != whole.OutputText() || final.Usage.OutputTokens != 12 {
		t.Fatalf("streamed %q, whole %q (final %v)", joined(evs), whole.OutputText(), final)
	}
	streamedID := final.ID
	got, err := cb.Responses.Get(ctx, whole.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != whole.OutputText() || got.Status != "incomplete" {
		t.Fatalf("retrieve at B: %v %v", err, got)
	}
	// Retrieved as a stream after event 3, at the other frontend.
	rest, _, err := readEvents(cb.Responses.GetStreaming(ctx, streamedID, responses.ResponseGetParams{StartingAfter: openai.Int(3)}), nil)
	if err != nil || len(rest) != len(evs)-4 || checkEvents(rest, 4) != nil || joined(rest) != joined(evs) {
		t.Fatalf("streamed retrieve after 3: %v, %d events (want %d)", err, len(rest), len(evs)-4)
	}
	items, err := ca.Responses.InputItems.List(ctx, whole.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Type != "message" || !strings.Contains(items.Data[0].RawJSON(), "Story number 3") {
		t.Fatalf("input items: %v %v", err, items)
	}

	t.Run("previous_response_id", func(t *testing.T) {
		next, err := cb.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", PreviousResponseID: openai.String(whole.ID),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and then")}, MaxOutputTokens: openai.Int(4)}, seedOpt(4)...)
		if err != nil {
			t.Fatal(err)
		}
		if next.PreviousResponseID != whole.ID || next.Usage.InputTokens <= whole.Usage.InputTokens {
			t.Fatalf("continued: %s (first had %d input tokens)", next.RawJSON(), whole.Usage.InputTokens)
		}
		// Another credential does not see the conversation.
		_, err = cb2.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", PreviousResponseID: openai.String(whole.ID),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}}, seedOpt(4)...)
		if statusOf(err) != 400 || !strings.Contains(errText(err), "previous_response_id") {
			t.Fatalf("previous response under another key: %v", err)
		}
	})

	t.Run("json_schema", func(t *testing.T) {
		schema := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}, "n": map[string]any{"type": "integer"}},
			"required": []string{"city", "n"}, "additionalProperties": false}
		r, err := ca.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("a city")},
			MaxOutputTokens: openai.Int(200), Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
				OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "place", Schema: schema, Strict: openai.Bool(true)}}}},
			option.WithJSONSet("seed", 5))
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			City *string `json:"city"`
			N    *int    `json:"n"`
		}
		if err := json.Unmarshal([]byte(r.OutputText()), &v); err != nil || v.City == nil || v.N == nil || r.Status != "completed" {
			t.Fatalf("json_schema output %q (%v), status %s", r.OutputText(), err, r.Status)
		}
	})

	t.Run("function_call", func(t *testing.T) {
		tool := responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{Name: "get_weather", Strict: openai.Bool(true),
			Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}, "additionalProperties": false}}}
		p := responses.ResponseNewParams{Model: "tiny", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather in Paris?")},
			MaxOutputTokens: openai.Int(200), Tools: []responses.ToolUnionParam{tool},
			ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)}}
		r, err := ca.Responses.New(ctx, p, option.WithJSONSet("seed", 6))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Output) == 0 || r.Output[0].Type != "function_call" || r.Output[0].Name != "get_weather" || r.Output[0].CallID == "" {
			t.Fatalf("function call: %s", r.RawJSON())
		}
		var args map[string]any
		if err := json.Unmarshal([]byte(r.Output[0].Arguments.OfString), &args); err != nil || args["city"] == nil {
			t.Fatalf("arguments %q: %v", r.Output[0].Arguments.OfString, err)
		}
		// Streamed: the call's events, its arguments whole.
		evs, _, err := readEvents(ca.Responses.NewStreaming(ctx, p, option.WithJSONSet("seed", 6)), nil)
		if err != nil || checkEvents(evs, 0) != nil || evs[3].Type != "response.function_call_arguments.delta" || evs[3].Delta != r.Output[0].Arguments.OfString {
			t.Fatalf("streamed call: %v %+v", err, evs)
		}
		// The call's output continues the conversation.
		out := responses.ResponseInputItemParamOfFunctionCallOutput(`{"temp": 21}`)
		out.OfFunctionCallOutput.CallID = openai.String(r.Output[0].CallID)
		next, err := ca.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", PreviousResponseID: openai.String(r.ID), MaxOutputTokens: openai.Int(4),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}}}, seedOpt(6)...)
		if err != nil || next.Usage.InputTokens <= r.Usage.InputTokens {
			t.Fatalf("after the call's output: %v %v", err, next)
		}
	})

	t.Run("cancel_at_another_frontend", func(t *testing.T) {
		bg, err := ca.Responses.New(ctx, story(8, 1500, true), seedOpt(8)...)
		if err != nil || (bg.Status != "queued" && bg.Status != "in_progress") || !bg.Background {
			t.Fatalf("background: %v %v", err, bg)
		}
		proctest.WaitFor(t, 10*time.Second, "the background response generating", func() (bool, string) {
			r, err := ca.Responses.Get(ctx, bg.ID, responses.ResponseGetParams{})
			return err == nil && len(r.OutputText()) > 0, fmt.Sprint(err)
		})
		c, err := cb.Responses.Cancel(ctx, bg.ID)
		if err != nil || c.Status != "cancelled" {
			t.Fatalf("cancel at B: %v %v", err, c)
		}
		proctest.WaitFor(t, 10*time.Second, "the workers' sequences cancelled", func() (bool, string) {
			h0, h1 := workerHealth(t, n, "n1-decode-tiny-0"), workerHealth(t, n, "n1-decode-tiny-1")
			return h0.Running+h1.Running+h0.Detached+h1.Detached == 0, fmt.Sprintf("running %d+%d", h0.Running, h1.Running)
		})
		if r, err := ca.Responses.Get(ctx, bg.ID, responses.ResponseGetParams{}); err != nil || r.Status != "cancelled" {
			t.Fatalf("after the cancel, at A: %v %v", err, r)
		}
	})

	t.Run("delete", func(t *testing.T) {
		r, err := ca.Responses.New(ctx, story(9, 4, false), seedOpt(9)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cb.Responses.Delete(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
		for _, c := range []openai.Client{ca, cb} {
			if _, err := c.Responses.Get(ctx, r.ID, responses.ResponseGetParams{}); statusOf(err) != 404 {
				t.Fatalf("deleted response: %v", err)
			}
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			err    func() error
			status int
			want   string
		}{
			{"unknown id", func() error { _, err := ca.Responses.Get(ctx, "resp_0123", responses.ResponseGetParams{}); return err }, 404, "response_not_found"},
			{"not a response id", func() error { _, err := ca.Responses.Get(ctx, "chatcmpl-1", responses.ResponseGetParams{}); return err }, 404, "response_not_found"},
			{"another key", func() error { _, err := ca2.Responses.Get(ctx, whole.ID, responses.ResponseGetParams{}); return err }, 404, "response_not_found"},
			{"another key cancels", func() error { _, err := cb2.Responses.Cancel(ctx, whole.ID); return err }, 404, "response_not_found"},
			{"starting_after past the end", func() error {
				_, _, err := readEvents(cb.Responses.GetStreaming(ctx, whole.ID, responses.ResponseGetParams{StartingAfter: openai.Int(10000)}), nil)
				return err
			}, 400, "starting_after"},
			{"negative starting_after", func() error {
				_, _, err := readEvents(cb.Responses.GetStreaming(ctx, whole.ID, responses.ResponseGetParams{StartingAfter: openai.Int(-1)}), nil)
				return err
			}, 400, "starting_after"},
			{"reasoning", func() error {
				_, err := ca.Responses.New(ctx, story(1, 4, false), option.WithJSONSet("reasoning", map[string]any{"effort": "high"}))
				return err
			}, 400, "reasoning"},
			{"web search tool", func() error {
				_, err := ca.Responses.New(ctx, story(1, 4, false), option.WithJSONSet("tools", []any{map[string]any{"type": "web_search"}}))
				return err
			}, 400, "tools[0].type"},
			{"image input", func() error {
				_, err := ca.Responses.New(ctx, story(1, 4, false), option.WithJSONSet("input", []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_image", "image_url": "x"}}}}))
				return err
			}, 400, "input[0].content[0].type"},
			{"max_output_tokens", func() error { _, err := ca.Responses.New(ctx, story(1, 0, false)); return err }, 400, "max_output_tokens"},
			{"oversized input", func() error {
				_, err := ca.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(strings.Repeat("words ", 2<<20))}})
				return err
			}, 413, ""},
		} {
			err := c.err()
			if statusOf(err) != c.status || !strings.Contains(errText(err), c.want) {
				t.Errorf("%s: %s, want %d naming %q", c.name, errText(err), c.status, c.want)
			}
		}
	})
}

// TestResponsesSurviveFailures: a background streamed response, through
// the SDK, loses its frontend (SIGKILL), its worker, or both mid-stream.
// A worker's death the SDK does not see; after its frontend's it resumes
// with retrieve(stream, starting_after = the last sequence number seen)
// at the other frontend. The events are a fault-free run's (types,
// sequence numbers, text), contiguous, with no duplicate.
func TestResponsesSurviveFailures(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	b := clustertest.StartFrontend(t, n, "--id", "B")
	cb := sdk(b, "k")
	ctx := context.Background()
	const tokens = 600
	want, _, err := readEvents(cb.Responses.NewStreaming(ctx, story(11, tokens, true), seedOpt(11)...), nil)
	if err != nil || checkEvents(want, 0) != nil || len(want) < tokens {
		t.Fatalf("fault-free: %v, %d events", err, len(want))
	}
	for i, faults := range []struct{ frontend, worker bool }{{true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("frontend=%v,worker=%v", faults.frontend, faults.worker), func(t *testing.T) {
			a := clustertest.StartFrontendProc(t, n, "--id", fmt.Sprintf("A%d", i))
			ca := sdk(a.URL, "k")
			s := ca.Responses.NewStreaming(ctx, story(11, tokens, true), seedOpt(11)...)
			defer s.Close()
			var id string
			got, _, err := readEvents(s, func(e respEvent) bool {
				if e.ID != "" {
					id = e.ID
				}
				return e.Seq >= 30
			})
			if err != nil || id == "" {
				t.Fatalf("first part: %v (id %q)", err, id)
			}
			if faults.worker {
				killServing(t, n)
				more, _, err := readEvents(s, func(e respEvent) bool { return faults.frontend && e.Seq >= 60 })
				if err != nil {
					t.Fatalf("after the worker's death: %v", err)
				}
				got = append(got, more...)
			}
			if faults.frontend {
				a.Signal(syscall.SIGKILL)
				<-a.Exited()
				s.Close()
				last := got[len(got)-1].Seq
				const took = `lifeline_frontend_takeovers_total{result="ok"}`
				before := metric(t, b, took)
				rest, _, err := readEvents(cb.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(last)}), nil)
				if err != nil {
					t.Fatalf("resumed at B after %d: %v", last, err)
				}
				got = append(got, rest...)
				// Still running when A died: B took it over (not a replay).
				if after := metric(t, b, took); after != before+1 {
					t.Fatalf("takeovers at B: %v, then %v", before, after)
				}
			}
			if err := sameEvents(got, want); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// sameEvents: got is want, event for event.
func sameEvents(got, want []respEvent) error {
	if err := checkEvents(got, 0); err != nil {
		return err
	}
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g.Type != w.Type || g.Delta != w.Delta {
			return fmt.Errorf("event %d: %s %q, want %s %q", i, g.Type, g.Delta, w.Type, w.Delta)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d events, want %d", len(got), len(want))
	}
	return nil
}

// killServing SIGKILLs the decode worker that is generating.
func killServing(t *testing.T, n *clustertest.Node) {
	for _, id := range []string{"n1-decode-tiny-0", "n1-decode-tiny-1"} {
		if workerHealth(t, n, id).Running > 0 {
			killWorker(t, n, id)
			return
		}
	}
	t.Fatal("no worker is generating")
}

// TestBackgroundResponseAdoptedWhenItsFrontendDies: a background response
// nobody follows loses its frontend (SIGKILL); no client asks for it, yet
// the other frontend adopts it (its key expired) and drives it to its
// end; retrieved afterwards it is a fault-free run's output.
func TestBackgroundResponseAdoptedWhenItsFrontendDies(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	b := clustertest.StartFrontend(t, n, "--id", "B")
	cb := sdk(b, "k")
	ctx := context.Background()
	const tokens = 1200
	finished := func(c openai.Client, id string) *responses.Response {
		var r *responses.Response
		proctest.WaitFor(t, 90*time.Second, "the background response finished", func() (bool, string) {
			got, err := c.Responses.Get(ctx, id, responses.ResponseGetParams{})
			if err != nil {
				return false, err.Error()
			}
			r = got
			return got.Status != "queued" && got.Status != "in_progress", string(got.Status)
		})
		return r
	}
	ref, err := cb.Responses.New(ctx, story(12, tokens, true), seedOpt(12)...)
	if err != nil {
		t.Fatal(err)
	}
	want := finished(cb, ref.ID)

	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	ca := sdk(a.URL, "k")
	bg, err := ca.Responses.New(ctx, story(12, tokens, true), seedOpt(12)...)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "the background response generating", func() (bool, string) {
		r, err := ca.Responses.Get(ctx, bg.ID, responses.ResponseGetParams{})
		return err == nil && len(r.OutputText()) > 0, fmt.Sprint(err)
	})
	const completes = `lifeline_frontend_request_record_writes_total{kind="complete"}`
	before := metric(t, b, completes)
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	proctest.WaitFor(t, 30*time.Second, "B adopting the orphan", func() (bool, string) {
		v := metric(t, b, `lifeline_frontend_takeovers_total{result="orphan"}`)
		return v == 1, fmt.Sprint("adopted: ", v)
	})
	proctest.WaitFor(t, 90*time.Second, "B completing it with no client", func() (bool, string) {
		v := metric(t, b, completes)
		return v > before, fmt.Sprint("completions: ", v)
	})
	got := finished(cb, bg.ID)
	if got.Status != want.Status || got.OutputText() != want.OutputText() || got.Usage.OutputTokens != tokens {
		t.Fatalf("adopted: %s %d tokens, want %s (identical text: %v)", got.Status, got.Usage.OutputTokens, want.Status, got.OutputText() == want.OutputText())
	}
}

// TestPolledResponseTakenOverWhenItsOwnerDied: a streamed response (not in
// the background: no frontend adopts it by itself) loses its frontend
// (SIGKILL) mid-stream; its client only polls GET /v1/responses/{id} at
// the other frontend, which finds the owner's key gone, takes the
// response over and drives it to its end: the polled object ends with a
// fault-free run's output. While the owner lived, a poll there would
// not take it (TestResponsesSDK polls a live owner's responses).
func TestPolledResponseTakenOverWhenItsOwnerDied(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	b := clustertest.StartFrontend(t, n, "--id", "B")
	cb := sdk(b, "k")
	ctx := context.Background()
	const tokens = 600
	want, err := cb.Responses.New(ctx, story(13, tokens, false), seedOpt(13)...)
	if err != nil {
		t.Fatal(err)
	}
	a := clustertest.StartFrontendProc(t, n, "--id", "A")
	ca := sdk(a.URL, "k")
	s := ca.Responses.NewStreaming(ctx, story(13, tokens, false), seedOpt(13)...)
	var id string
	if _, _, err := readEvents(s, func(e respEvent) bool {
		if e.ID != "" {
			id = e.ID
		}
		return e.Seq >= 20
	}); err != nil || id == "" {
		t.Fatalf("first events: %v (id %q)", err, id)
	}
	a.Signal(syscall.SIGKILL)
	<-a.Exited()
	s.Close()
	var got *responses.Response
	proctest.WaitFor(t, 60*time.Second, "the polled response finished at B", func() (bool, string) {
		r, err := cb.Responses.Get(ctx, id, responses.ResponseGetParams{})
		if err != nil {
			return false, err.Error()
		}
		got = r
		return r.Status != "in_progress", string(r.Status)
	})
	if got.Status != want.Status || got.OutputText() != want.OutputText() || got.Usage.OutputTokens != tokens {
		t.Fatalf("polled to its end: %s, %d tokens, identical text %v; want %s", got.Status, got.Usage.OutputTokens, got.OutputText() == want.OutputText(), want.Status)
	}
}

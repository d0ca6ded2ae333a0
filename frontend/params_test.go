package frontend

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestParseRequest: each parameter's accepted and refused values, with the
// parameter a refusal names and its code.
func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chat  bool
		body  string
		param string // "" : accepted
		code  string
		check func(CompletionRequest) bool
	}{
		{name: "plain", body: `{"model":"m","prompt":"hi"}`, check: func(b CompletionRequest) bool { return b.Prompt == "hi" && !b.SeedSet }},
		{name: "unknown field", body: `{"model":"m","prompt":"hi","x_whatever":{"a":1}}`},
		{name: "prompt array of one", body: `{"model":"m","prompt":["hi"]}`, check: func(b CompletionRequest) bool { return b.Prompt == "hi" }},
		{name: "prompt array past its bound", body: `{"model":"m","prompt":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}`, param: "prompt", code: CodeInvalidValue},
		{name: "token ids", body: `{"model":"m","prompt":[5,6,7]}`, check: func(b CompletionRequest) bool { return len(b.PromptTokens) == 3 && b.PromptTokens[2] == 7 }},
		{name: "token id arrays of one", body: `{"model":"m","prompt":[[5,6]]}`, check: func(b CompletionRequest) bool { return len(b.PromptTokens) == 2 }},
		{name: "token id wraps", body: `{"model":"m","prompt":[4294967301]}`, param: "prompt", code: CodeInvalidValue},
		{name: "negative token id", body: `{"model":"m","prompt":[-1]}`, param: "prompt", code: CodeInvalidValue},
		{name: "no prompt", body: `{"model":"m"}`, param: "prompt", code: CodeMissingRequired},
		{name: "empty prompt", body: `{"model":"m","prompt":""}`, param: "prompt", code: CodeInvalidValue},
		{name: "no model", body: `{"prompt":"x"}`, param: "model", code: CodeMissingRequired},
		{name: "invalid UTF-8 prompt", body: "{\"model\":\"m\",\"prompt\":\"a\xff\"}", param: "prompt", code: CodeInvalidValue},
		{name: "invalid UTF-8 stop", body: "{\"model\":\"m\",\"prompt\":\"a\",\"stop\":\"\xc3\"}", param: "stop", code: CodeInvalidValue},
		{name: "invalid UTF-8 content", chat: true, body: "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", param: "messages", code: CodeInvalidValue},
		{name: "stop string", body: `{"model":"m","prompt":"a","stop":"\n"}`, check: func(b CompletionRequest) bool { return len(b.Stop) == 1 && b.Stop[0] == "\n" }},
		{name: "stop array", body: `{"model":"m","prompt":"a","stop":["x","y"]}`, check: func(b CompletionRequest) bool { return len(b.Stop) == 2 }},
		{name: "stop five", body: `{"model":"m","prompt":"a","stop":["a","b","c","d","e"]}`, param: "stop", code: CodeInvalidValue},
		{name: "stop empty", body: `{"model":"m","prompt":"a","stop":[""]}`, param: "stop", code: CodeInvalidValue},
		{name: "stop number", body: `{"model":"m","prompt":"a","stop":3}`, param: "stop", code: CodeInvalidValue},
		{name: "top_k wraps", body: `{"model":"m","prompt":"a","top_k":4294967297}`, param: "top_k", code: CodeInvalidValue},
		{name: "top_k negative", body: `{"model":"m","prompt":"a","top_k":-1}`, param: "top_k", code: CodeInvalidValue},
		{name: "top_k fraction", body: `{"model":"m","prompt":"a","top_k":1.5}`, param: "top_k", code: CodeInvalidValue},
		{name: "top_k", body: `{"model":"m","prompt":"a","top_k":2147483647}`, check: func(b CompletionRequest) bool { return b.TopK == 1<<31-1 }},
		{name: "temperature 2", body: `{"model":"m","prompt":"a","temperature":2}`, check: func(b CompletionRequest) bool { return *b.Temperature == 2 }},
		{name: "temperature 2.1", body: `{"model":"m","prompt":"a","temperature":2.1}`, param: "temperature", code: CodeInvalidValue},
		{name: "temperature -0.1", body: `{"model":"m","prompt":"a","temperature":-0.1}`, param: "temperature", code: CodeInvalidValue},
		{name: "top_p 0", body: `{"model":"m","prompt":"a","top_p":0}`, param: "top_p", code: CodeInvalidValue},
		{name: "top_p 3", body: `{"model":"m","prompt":"a","top_p":3}`, param: "top_p", code: CodeInvalidValue},
		{name: "top_p 1", body: `{"model":"m","prompt":"a","top_p":1}`, check: func(b CompletionRequest) bool { return *b.TopP == 1 }},
		{name: "penalty", body: `{"model":"m","prompt":"a","frequency_penalty":-2,"presence_penalty":2}`, check: func(b CompletionRequest) bool { return b.FrequencyPenalty == -2 && b.PresencePenalty == 2 }},
		{name: "penalty out", body: `{"model":"m","prompt":"a","presence_penalty":2.5}`, param: "presence_penalty", code: CodeInvalidValue},
		{name: "seed max", body: `{"model":"m","prompt":"a","seed":9223372036854775807}`, check: func(b CompletionRequest) bool { return b.Seed == 1<<63-1 && b.SeedSet }},
		{name: "seed 0", body: `{"model":"m","prompt":"a","seed":0}`, check: func(b CompletionRequest) bool { return b.Seed == 0 && b.SeedSet }},
		{name: "seed over", body: `{"model":"m","prompt":"a","seed":9223372036854775808}`, param: "seed", code: CodeInvalidValue},
		{name: "seed negative", body: `{"model":"m","prompt":"a","seed":-1}`, param: "seed", code: CodeInvalidValue},
		{name: "max_tokens 0", body: `{"model":"m","prompt":"a","max_tokens":0}`, param: "max_tokens", code: CodeInvalidValue},
		{name: "max_tokens wraps", body: `{"model":"m","prompt":"a","max_tokens":4294967297}`, param: "max_tokens", code: CodeInvalidValue},
		{name: "max_completion_tokens", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":3}`, check: func(b CompletionRequest) bool { return b.maxTokens() == 3 }},
		{name: "max tokens both equal", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":3,"max_tokens":3}`, check: func(b CompletionRequest) bool { return b.maxTokens() == 3 }},
		{name: "max tokens conflict", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":3,"max_tokens":4}`, param: "max_completion_tokens", code: CodeInvalidValue},
		{name: "content parts", chat: true, body: `{"model":"m","messages":[{"role":"developer","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			check: func(b CompletionRequest) bool { return b.Prompt == "system: s\nuser: ab\nassistant:" }},
		{name: "image part", chat: true, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, param: "messages[0].content[0].type", code: CodeUnsupportedParameter},
		{name: "bad role", chat: true, body: `{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, param: "messages[0].role", code: CodeInvalidValue},
		{name: "no messages", chat: true, body: `{"model":"m","messages":[]}`, param: "messages", code: CodeMissingRequired},
		{name: "include_usage", body: `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":true,"resumable":true}}`,
			check: func(b CompletionRequest) bool { return b.StreamOptions.IncludeUsage && b.StreamOptions.Resumable }},
		{name: "include_usage unstreamed", body: `{"model":"m","prompt":"a","stream_options":{"include_usage":true}}`, param: "stream_options", code: CodeInvalidValue},
		{name: "defaults of the refused", body: `{"model":"m","prompt":"a","n":1,"best_of":1,"logprobs":null,"echo":false,"logit_bias":{},"user":"u","suffix":"","response_format":{"type":"text"}}`},
		{name: "chat logprobs false", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":false,"top_logprobs":0,"tools":[],"modalities":["text"]}`},
		{name: "n past its bound", body: `{"model":"m","prompt":"a","n":17}`, param: "n", code: CodeInvalidValue},
		{name: "tools with n 2", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"n":2,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`, param: "n", code: CodeUnsupportedParameter},
		// logprobs, echo, response_format and tools work since issue 12
		// (structured_test.go has their cases); what stays refused here is
		// what needs what it lacks.
		{name: "logprobs 1", body: `{"model":"m","prompt":"a","logprobs":1}`, check: func(b CompletionRequest) bool { return b.Logprobs && b.TopLogprobs == 1 }},
		{name: "logprobs true", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true}`, check: func(b CompletionRequest) bool { return b.Logprobs }},
		{name: "top_logprobs", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"top_logprobs":2}`, param: "top_logprobs", code: CodeInvalidValue},
		{name: "echo", body: `{"model":"m","prompt":"a","echo":true}`, check: func(b CompletionRequest) bool { return b.Echo }},
		{name: "logit_bias", body: `{"model":"m","prompt":"a","logit_bias":{"5":10,"7":-100}}`,
			check: func(b CompletionRequest) bool {
				return len(b.LogitBias) == 2 && b.LogitBias[5] == 10 && b.LogitBias[7] == -100
			}},
		{name: "logit_bias past 100", body: `{"model":"m","prompt":"a","logit_bias":{"5":101}}`, param: "logit_bias", code: CodeInvalidValue},
		{name: "logit_bias not a number", body: `{"model":"m","prompt":"a","logit_bias":{"5":"x"}}`, param: "logit_bias", code: CodeInvalidValue},
		{name: "logit_bias key", body: `{"model":"m","prompt":"a","logit_bias":{"five":1}}`, param: "logit_bias", code: CodeInvalidValue},
		{name: "logit_bias negative id", body: `{"model":"m","prompt":"a","logit_bias":{"-1":1}}`, param: "logit_bias", code: CodeInvalidValue},
		{name: "logit_bias id past int32", body: `{"model":"m","prompt":"a","logit_bias":{"4294967301":1}}`, param: "logit_bias", code: CodeInvalidValue},
		{name: "best_of", body: `{"model":"m","prompt":"a","best_of":3}`, param: "best_of", code: CodeUnsupportedParameter},
		{name: "json_object", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_object"}}`,
			check: func(b CompletionRequest) bool {
				return b.Structured != nil && b.Structured.Kind == StructuredJSONObject
			}},
		{name: "tools", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			check: func(b CompletionRequest) bool { return len(b.Tools) == 1 && b.ToolCalls != nil && b.ToolCalls.Optional }},
		{name: "tool_choice", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"tool_choice":"auto"}`, param: "tool_choice", code: CodeInvalidValue},
		{name: "functions", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"functions":[{"name":"f"}]}`, param: "functions", code: CodeUnsupportedParameter},
		{name: "suffix", body: `{"model":"m","prompt":"a","suffix":"z"}`, param: "suffix", code: CodeUnsupportedParameter},
		{name: "parallel_tool_calls", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"parallel_tool_calls":true}`, param: "parallel_tool_calls", code: CodeInvalidValue},
		{name: "prediction", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"prediction":{"type":"content","content":"x"}}`, param: "prediction", code: CodeUnsupportedParameter},
		{name: "audio", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"audio":{"voice":"x"}}`, param: "audio", code: CodeUnsupportedParameter},
		{name: "modalities", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"modalities":["text","audio"]}`, param: "modalities", code: CodeUnsupportedParameter},
		{name: "tool message", chat: true, body: `{"model":"m","messages":[{"role":"tool","content":"a","tool_call_id":"x"}]}`,
			check: func(b CompletionRequest) bool { return b.Prompt == "tool x: a\nassistant:" }},
		{name: "function message", chat: true, body: `{"model":"m","messages":[{"role":"function","content":"a","name":"f"}]}`, param: "messages[0].role", code: CodeUnsupportedParameter},
		{name: "timeout_ms", body: `{"model":"m","prompt":"a","timeout_ms":-5}`, param: "timeout_ms", code: CodeInvalidValue},
		{name: "wrong type", body: `{"model":"m","prompt":"a","stream":"yes"}`, param: "stream", code: CodeInvalidValue},
		// A number as a string: encoding/json's Number took "10" and "2";
		// "hot" was a 400 naming no parameter.
		{name: "max_tokens as a string", body: `{"model":"m","prompt":"a","max_tokens":"10"}`, param: "max_tokens", code: CodeInvalidValue},
		{name: "n as a string", body: `{"model":"m","prompt":"a","n":"2"}`, param: "n", code: CodeInvalidValue},
		{name: "temperature hot", body: `{"model":"m","prompt":"a","temperature":"hot"}`, param: "temperature", code: CodeInvalidValue},
		{name: "seed as an object", body: `{"model":"m","prompt":"a","seed":{}}`, param: "seed", code: CodeInvalidValue},
		{name: "top_p as a bool", body: `{"model":"m","prompt":"a","top_p":true}`, param: "top_p", code: CodeInvalidValue},
		{name: "nested wrong type", body: `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}`, param: "stream_options.include_usage", code: CodeInvalidValue},
		{name: "model as a number", body: `{"model":5,"prompt":"a"}`, param: "model", code: CodeInvalidValue},
		{name: "null number", body: `{"model":"m","prompt":"a","max_tokens":null,"temperature":null}`, check: func(b CompletionRequest) bool { return b.MaxTokens == nil && b.Temperature == nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := parseRequest([]byte(tc.body), tc.chat)
			if err == nil {
				err = b.validate()
			}
			if tc.param == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if tc.check != nil && !tc.check(b) {
					t.Fatalf("parsed %+v", b)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param || pe.Code != tc.code || pe.Message == "" {
				t.Fatalf("got %#v (%v), want param %q code %q", pe, err, tc.param, tc.code)
			}
		})
	}
}

// TestTypeErrorsSayWhatToSend: a wrong type names the parameter, the
// type it takes and the type it got.
func TestTypeErrorsSayWhatToSend(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","prompt":"a","max_tokens":"10"}`:     "max_tokens must be a number (got a JSON string)",
		`{"model":"m","prompt":"a","temperature":"hot"}`:   "temperature must be a number (got a JSON string)",
		`{"model":"m","prompt":"a","stream":1}`:            "stream must be a boolean (got a JSON number)",
		`{"model":"m","prompt":"a","stop":"x","model":[]}`: "model must be a string (got a JSON array)",
	} {
		_, err := parseRequest([]byte(body), false)
		if err == nil || err.Error() != want && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// TestCheckContentType: JSON, with or without a UTF-8 charset, and
// nothing else.
func TestCheckContentType(t *testing.T) {
	for ct, ok := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "Application/JSON; charset=UTF-8": true,
		"": false, "text/plain": false, "application/x-www-form-urlencoded": false, "multipart/form-data; boundary=x": false,
		"application/json; charset=latin1": false, "application/jsonx": false, "application/json;;": false,
	} {
		req := httptest.NewRequest("POST", "/v1/completions", nil)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		err := checkContentType(req)
		var be *BodyError
		if ok && err != nil || !ok && (!errors.As(err, &be) || be.Status != 415 || be.Code != CodeUnsupportedContentType) {
			t.Errorf("%q: %v", ct, err)
		}
	}
}

// TestParsePosition: resume positions are digits only.
func TestParsePosition(t *testing.T) {
	for in, want := range map[string]int{"": 0, "0": 0, "17": 17} {
		if n, err := parsePosition(in); err != nil || n != want {
			t.Fatalf("%q: %d %v", in, n, err)
		}
	}
	for _, bad := range []string{"1;DROP", "-1", "+1", " 1", "1 ", "0x10", "99999999999", "1e3"} {
		if _, err := parsePosition(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// TestWorkerParamError: a worker's refusal becomes a plain sentence naming
// its parameter; a context overflow has its own code.
func TestWorkerParamError(t *testing.T) {
	e := workerParamError("decode: invalid request: max_tokens: prompt of 5 tokens plus max_tokens 900 exceeds the context of 256")
	if e.Param != "max_tokens" || e.Code != CodeContextLengthExceeded || strings.Contains(e.Message, "decode") {
		t.Fatalf("%+v", e)
	}
	e = workerParamError("decode: invalid request: prompt: token 99999 out of vocabulary")
	if e.Param != "prompt" || e.Code != CodeInvalidValue || strings.HasPrefix(e.Message, "decode") {
		t.Fatalf("%+v", e)
	}
}

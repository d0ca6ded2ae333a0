package main

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// parseLines decodes the JSON token lines of `engine generate --json`.
func parseLines(t *testing.T, out string) []decode.TokenLine {
	t.Helper()
	return proctest.JSONLines[decode.TokenLine](t, out)
}

// TestGenerateContinuesAfterPrefix runs the real binary twice: once whole,
// once told that the first k tokens were already generated, and checks that
// the second run prints exactly the tail of the first.
func TestGenerateContinuesAfterPrefix(t *testing.T) {
	t.Parallel()
	args := []string{"engine", "generate", "--preset", "tiny", "--prompt", "Once upon a time", "--seed", "42",
		"--temperature", "0.9", "--top-p", "0.9", "--top-k", "40", "--max-tokens", "30", "--ignore-eos", "--json"}
	out, errOut, err := proctest.Run(t, args...)
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	full := parseLines(t, out)
	if len(full) != 30 || full[29].FinishReason != "length" {
		t.Fatalf("%d lines, last %+v", len(full), full[len(full)-1])
	}
	for i, l := range full {
		if l.SequenceNo != i+1 || !utf8.ValidString(l.Text) {
			t.Fatalf("line %d: %+v", i, l)
		}
	}
	for _, k := range []int{1, 13, 29} {
		var ids []string
		for _, l := range full[:k] {
			ids = append(ids, fmt.Sprint(l.TokenID))
		}
		out, errOut, err := proctest.Run(t, append(args, "--prefix-tokens", strings.Join(ids, ","))...)
		if err != nil {
			t.Fatalf("k=%d: %v: %s", k, err, errOut)
		}
		tail := parseLines(t, out)
		if fmt.Sprint(tail) != fmt.Sprint(full[k:]) {
			t.Fatalf("k=%d: continuation\n%v\nwant\n%v", k, tail, full[k:])
		}
	}
	// Plain text is the concatenation of the JSON texts.
	plain, _, err := proctest.Run(t, args[:len(args)-1]...)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, l := range full {
		want.WriteString(l.Text)
	}
	if strings.TrimSuffix(plain, "\n") != want.String() {
		t.Fatalf("plain output %q, want %q", plain, want.String())
	}
}

func TestGenerateBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", ""}, "prompt: empty"},
		{[]string{"--prompt", "ok\xff"}, "not valid UTF-8"},
		{[]string{"--prompt", strings.Repeat("the ", 5000)}, "do not fit the context"},
		{[]string{"--prompt", "hi", "--max-tokens", "0"}, "max_tokens"},
		{[]string{"--prompt", "hi", "--preset", "galactic"}, "unknown preset"},
		{[]string{"--prompt", "hi", "--prefix-tokens", "1,x"}, "not a token id"},
		{[]string{"--prompt", "hi", "--temperature", "-2"}, "temperature"},
		{[]string{"--prompt", "hi", "--model", "/nonexistent/model.bin", "--tokenizer", "/nonexistent/t.bin"}, "no such file"},
	} {
		_, errOut, err := proctest.Run(t, append([]string{"engine", "generate"}, c.args...)...)
		if err == nil {
			t.Errorf("%v: exit 0", c.args)
			continue
		}
		if !strings.Contains(errOut, c.want) || strings.Contains(errOut, "panic") || strings.Contains(errOut, "goroutine ") {
			t.Errorf("%v: stderr %q, want it to mention %q", c.args, errOut, c.want)
		}
	}
}

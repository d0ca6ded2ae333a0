package main

import (
	"net"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestGenerateFailsOver: lifeline generate with a dead first --url (nothing
// listens) and a live second prints the stream the live one serves.
func TestGenerateFailsOver(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	url := clustertest.StartFrontend(t, n)
	temp := 0.9
	var text strings.Builder
	if _, err := client.New(url).Stream(t.Context(), client.Request{Model: "tiny", Prompt: "Far away", MaxTokens: 160, Temperature: &temp, Seed: 11, IgnoreEOS: true},
		func(tok client.Token) { text.WriteString(tok.Text) }); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	out, errOut, err := proctest.Run(t, "generate", "--url", dead, "--url", url, "--model", "tiny", "--max-tokens", "160",
		"--seed", "11", "--temperature", "0.9", "--ignore-eos", "Far away")
	if err != nil || strings.TrimSuffix(out, "\n") != text.String() {
		t.Fatalf("lifeline generate: %v %s\n%q\nwant %q", err, errOut, out, text.String())
	}
}

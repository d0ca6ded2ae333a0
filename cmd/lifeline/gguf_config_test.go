package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestGGUFRefusedAtConfigTime: a GGUF instance whose file cannot be
// served is refused by `agent --check-config` and by `lifeline up`
// before anything starts, with an error that names what is wrong; a
// sound file passes where the binary links llama.cpp and is refused,
// saying how to build one that does, where it does not.
func TestGGUFRefusedAtConfigTime(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := llamacpptest.WriteModel(t, dir, llamacpptest.TinyQwen2, 1)
	writeFile := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	gptj := append([]byte(nil), whole...)
	i := strings.Index(string(gptj), "qwen2")
	copy(gptj[i:], "gpt9x") // general.architecture's value
	cases := []struct{ model, role, want string }{
		{filepath.Join(dir, "none.gguf"), "decode", "no such file"},
		{writeFile("text.gguf", []byte("this is not a model at all, only text\n")), "decode", "not a GGUF file"},
		{writeFile("cut.gguf", whole[:len(whole)/2]), "decode", "truncated"},
		{writeFile("arch.gguf", gptj), "decode", `architecture "gpt9x", which llama.cpp`},
		{"relative.gguf", "decode", "an absolute path"},
		{good, "prefill", "instances[0].role"},
	}
	ca := clustertest.CADir(t)
	certs := clustertest.Issue(t, ca, "agent", "a")
	check := func(model, role string) (string, error) {
		cfg := fmt.Sprintf(`{"node_id": "a", "data_dir": %q, "socket": "s", "etcd": ["127.0.0.1:1"], "certs": %q, "arena": "/dev/shm/x",
			"instances": [{"role": %q, "engine": "llamacpp", "model": %q, "count": 1}]}`, dir, certs, role, model)
		p := writeFile("agent.json", []byte(cfg))
		out, errOut, err := proctest.Run(t, "agent", "--config", p, "--check-config")
		return out + errOut, err
	}
	for _, c := range cases {
		if out, err := check(c.model, c.role); err == nil || !strings.Contains(out, c.want) || strings.Contains(out, "panic") {
			t.Errorf("agent --check-config, %s as %s: %v %q, want it to say %q", c.model, c.role, err, out, c.want)
		}
		if c.role != "decode" || !filepath.IsAbs(c.model) {
			continue
		}
		data := filepath.Join(t.TempDir(), "up")
		out, errOut, err := proctest.Run(t, "up", "--data-dir", data, "--engine", "llamacpp", "--model", c.model, "--listen", proctest.FreeTCPAddr(t))
		if err == nil || !strings.Contains(errOut, c.want) || strings.Contains(out, "URL") {
			t.Errorf("up --model %s: %v %q %q, want it refused saying %q", c.model, err, out, errOut, c.want)
		}
		if _, err := os.Stat(data); err == nil {
			t.Errorf("up --model %s made its data directory before refusing the file", c.model)
		}
	}
	out, err := check(good, "decode")
	switch {
	case gguf.Linked && (err != nil || !strings.Contains(out, "config OK")):
		t.Fatalf("a sound GGUF with llama.cpp linked: %v %q", err, out)
	case !gguf.Linked && (err == nil || !strings.Contains(out, "go build -tags llamacpp")):
		t.Fatalf("a sound GGUF without llama.cpp: %v %q, want the way to build it", err, out)
	}
}

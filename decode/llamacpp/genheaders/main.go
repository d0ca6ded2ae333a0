// Command genheaders copies llama.h and the ggml headers it includes from
// the ollama module go.mod names into include/: the cgo binding compiles
// against exactly the llama.cpp it links, and a build needs no module
// path on its command line.
package main

import (
	"encoding/json"
	"log"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	out, err := exec.Command("go", "list", "-m", "-json", "github.com/ollama/ollama").Output()
	if err != nil {
		log.Fatalf("genheaders: the ollama module: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		log.Fatalf("genheaders: go list -m: %v %s", err, out)
	}
	files := map[string]string{"llama.h": "llama/llama.cpp/include", "LICENSE": "llama/llama.cpp"}
	for _, h := range []string{"ggml.h", "ggml-cpu.h", "ggml-backend.h", "ggml-opt.h", "ggml-alloc.h"} {
		files[h] = "ml/backend/ggml/ggml/include"
	}
	if err := os.MkdirAll("include", 0o755); err != nil {
		log.Fatal(err)
	}
	for name, dir := range files {
		b, err := os.ReadFile(filepath.Join(mod.Dir, dir, name))
		if err != nil {
			log.Fatal(err)
		}
		head := "// Copied from " + filepath.Join("github.com/ollama/ollama", dir, name) + " by genheaders; DO NOT EDIT.\n"
		if name == "LICENSE" {
			head = "" // llama.cpp's and ggml's (MIT), for the headers beside it
		}
		if err := os.WriteFile(filepath.Join("include", name), append([]byte(head), b...), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

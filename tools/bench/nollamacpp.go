//go:build !llamacpp

package main

import "errors"

// runLlamaCppBench needs the binding: go run -tags llamacpp ./tools/bench -only llamacpp.
func runLlamaCppBench() error {
	return errors.New("-only llamacpp: this bench was built without llama.cpp; run it with go run -tags llamacpp ./tools/bench -only llamacpp")
}

//go:build !llamacpp

package main

import "errors"

// runLlamaCppBench needs the binding: go run -tags llamacpp ./tools/bench -only llamacpp.
func runLlamaCppBench() error {
	return errors.New("-only llamacpp: this bench was built without llama.cpp; run it with go run -tags llamacpp ./tools/bench -only llamacpp")
}

// runGoEngineBench compares with llama.cpp: it needs the binding too.
func runGoEngineBench() error {
	return errors.New("-only goengine: this bench was built without llama.cpp; run it with go run -tags llamacpp ./tools/bench -only goengine")
}

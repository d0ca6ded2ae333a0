//go:build !llamacpp

package gguf

// Linked says whether this binary links llama.cpp (build tag llamacpp):
// a GGUF file is served only by a binary that does.
const Linked = false

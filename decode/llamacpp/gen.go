//go:generate go run ./genheaders

// The binding is in llamacpp.go, built with the tag llamacpp only.

package llamacpp

// Package kvpb holds the wire messages of the KV service, generated from
// lifeline_kv.proto by protoc-gen-go (committed, so building needs no protoc).
package kvpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative lifeline_kv.proto

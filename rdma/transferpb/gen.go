// Package transferpb holds the wire messages of the KV transfer engine
// (generated from lifeline_transfer.proto; `make generate`).
package transferpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative lifeline_transfer.proto

// Package wire holds the protobuf frames between frontends and worker
// instances, generated from lifeline_wire.proto (committed; building needs no protoc).
package wire

//go:generate protoc --go_out=. --go_opt=paths=source_relative lifeline_wire.proto

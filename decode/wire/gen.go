// Package wire holds the protobuf frames between frontends and worker
// instances, generated from wire.proto (committed; building needs no protoc).
package wire

//go:generate protoc --go_out=. --go_opt=paths=source_relative wire.proto

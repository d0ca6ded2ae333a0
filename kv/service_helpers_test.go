package kv

import (
	"bufio"
	"net"

	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

func newBufReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }
func newBufWriter(c net.Conn) *bufio.Writer { return bufio.NewWriter(c) }

func allocReq(n uint32) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Allocate{Allocate: &kvpb.Allocate{Count: n}}}
}

func sealReq(r Ref, key []byte) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Seal{Seal: &kvpb.Seal{Ref: toPB(r), Key: key}}}
}

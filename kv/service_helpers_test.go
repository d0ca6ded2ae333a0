package kv

import (
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

func allocReq(n uint32) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Allocate{Allocate: &kvpb.Allocate{Count: n}}}
}

func sealReq(r Ref, key []byte) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Seal{Seal: &kvpb.Seal{Ref: toPB(r), Key: key}}}
}

package kv

import (
	"bufio"
	"net"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

func allocReq(n uint32) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Allocate{Allocate: &kvpb.Allocate{Count: n}}}
}

func sealReq(r Ref, key []byte) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Seal{Seal: &kvpb.Seal{Ref: kvclient.RefToPB(r), Key: key}}}
}

func helloReq(w Writer) *kvpb.Request {
	return &kvpb.Request{Op: &kvpb.Request_Hello{Hello: &kvpb.Hello{InstanceId: w.Instance, Generation: w.Gen}}}
}

// rawRoundTrip sends req on conn as a client would, with none of the
// client's checks, and returns the owner's answer: a *RemoteError where
// it is not OK.
func rawRoundTrip(conn net.Conn, req *kvpb.Request) (*kvpb.Response, error) {
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := frame.Write(conn, req); err != nil {
		return nil, err
	}
	var resp kvpb.Response
	if err := frame.Read(bufio.NewReader(conn), &resp); err != nil {
		return nil, err
	}
	if resp.Code != kvpb.Code_OK {
		return nil, &RemoteError{Code: resp.Code, Message: resp.Message}
	}
	return &resp, nil
}

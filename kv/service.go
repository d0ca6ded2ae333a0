package kv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/internal/unixsock"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// WaitServing waits until an owner accepts connections on socket, or ctx
// ends.
func WaitServing(ctx context.Context, socket string) error {
	for {
		if c, err := net.Dial("unix", socket); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kv: owner at %s not serving: %w", socket, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Serve answers KV service requests on a unix socket (created mode 0600)
// and sweeps every LeaseTTL/3 until ctx is done.
func Serve(ctx context.Context, o *Owner, socketPath string) error {
	return serve(ctx, o, socketPath, nil)
}

func serve(ctx context.Context, o *Owner, socketPath string, ready chan<- struct{}) error {
	// Mode 0600 from the start (workers run as the agent's user); it
	// replaces a stale socket of a previous owner.
	ln, err := unixsock.Listen(socketPath, 0o600)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	o.StartGrace()
	if ready != nil {
		close(ready)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(max(o.LeaseTTL()/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				ln.Close()
				return
			case <-t.C:
				o.Sweep()
			}
		}
	}()
	var conns sync.Map
	defer conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("kv: accept: %w", err)
			}
			// Out of file descriptors and the like: wait, do not die.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		conns.Store(c, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conns.Delete(c)
			defer c.Close()
			serveConn(o, c)
		}()
	}
}

func serveConn(o *Owner, c net.Conn) {
	r := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	var sid SessionID
	for {
		var req kvpb.Request
		if err := frame.Read(r, &req); err != nil {
			return // client gone or garbage: its session lives until its lease ends
		}
		resp := handle(o, &sid, &req)
		resp.Id = req.Id
		if frame.Write(w, resp) != nil || w.Flush() != nil {
			return
		}
	}
}

// handle answers one request on a connection whose session is *sid.
func handle(o *Owner, sid *SessionID, req *kvpb.Request) *kvpb.Response {
	resp := &kvpb.Response{}
	err := needsHello(*sid, req)
	if err == nil {
		err = dispatch(o, sid, req, resp)
	}
	if err != nil {
		// Handlers set the answer's fields only on success.
		resp.Code, resp.Message = kvclient.CodeOf(err), err.Error()
	}
	return resp
}

// needsHello refuses a session operation on a connection that has not
// said hello.
func needsHello(sid SessionID, req *kvpb.Request) error {
	if sid != 0 {
		return nil
	}
	switch req.Op.(type) {
	case *kvpb.Request_Hello:
	case *kvpb.Request_Stats, *kvpb.Request_WriterDead, *kvpb.Request_Sweep, *kvpb.Request_Lookup, *kvpb.Request_Delete, *kvpb.Request_KeepAlive:
		// Session-free operations for operators and the agent.
	default:
		return fmt.Errorf("%w: send hello first", ErrUnknownSession)
	}
	return nil
}

// dispatch runs the request's operation and fills in resp.
func dispatch(o *Owner, sid *SessionID, req *kvpb.Request, resp *kvpb.Response) error {
	switch op := req.Op.(type) {
	case *kvpb.Request_Hello:
		return handleHello(o, sid, op.Hello, resp)
	case *kvpb.Request_KeepAlive:
		target := *sid
		if op.KeepAlive.GetSession() != 0 {
			target = SessionID(op.KeepAlive.GetSession())
		}
		return o.KeepAlive(target)
	case *kvpb.Request_Allocate:
		refs, err := o.Allocate(*sid, int(op.Allocate.Count))
		if err == nil {
			resp.Refs = kvclient.RefsToPB(refs)
		}
		return err
	case *kvpb.Request_Seal:
		return handleSeal(o, *sid, op.Seal)
	case *kvpb.Request_Publish:
		return o.Publish(*sid, kvclient.RefFromPB(op.Publish.Ref))
	case *kvpb.Request_Abort:
		return o.Abort(*sid, kvclient.RefFromPB(op.Abort.Ref))
	case *kvpb.Request_Acquire:
		return handleAcquire(o, *sid, op.Acquire, resp)
	case *kvpb.Request_Release:
		return o.Release(*sid, kvclient.RefFromPB(op.Release.Ref))
	case *kvpb.Request_SealPublish:
		return handleSealPublish(o, *sid, op.SealPublish, resp)
	default:
		return dispatchAdmin(o, req, resp)
	}
}

// dispatchAdmin runs the operations that need no session.
func dispatchAdmin(o *Owner, req *kvpb.Request, resp *kvpb.Response) error {
	switch op := req.Op.(type) {
	case *kvpb.Request_Lookup:
		keys, err := keysFromPB(op.Lookup)
		if err != nil {
			return err
		}
		resp.Count = uint32(o.Lookup(keys))
	case *kvpb.Request_Delete:
		return o.Delete(kvclient.RefFromPB(op.Delete.Ref))
	case *kvpb.Request_ReportCorrupt:
		dropped, err := o.ReportCorrupt(kvclient.RefFromPB(op.ReportCorrupt.Ref))
		if err != nil {
			return err
		}
		resp.Dropped = dropped
	case *kvpb.Request_WriterDead:
		resp.Count = uint32(o.WriterDead(Writer{Instance: op.WriterDead.InstanceId, Gen: op.WriterDead.Generation}))
	case *kvpb.Request_Sweep:
		res := o.Sweep()
		resp.Count = uint32(res.OrphansReclaimed + res.Evicted)
	case *kvpb.Request_Stats:
		resp.Stats = statsToPB(o.Stats())
	default:
		return fmt.Errorf("%w: unknown operation", ErrBadRequest)
	}
	return nil
}

// handleHello opens the connection's session.
func handleHello(o *Owner, sid *SessionID, h *kvpb.Hello, resp *kvpb.Response) error {
	w := Writer{Instance: h.InstanceId, Gen: h.Generation}
	id, ownedOK, leasedOK, err := o.Hello(w, kvclient.RefsFromPB(h.Owned), kvclient.RefsFromPB(h.Leased))
	if err != nil {
		return err
	}
	if h.Replaces != 0 {
		o.EndReplaced(w, id, SessionID(h.Replaces))
	}
	*sid = id
	g := o.Arena().Geometry()
	resp.Hello = &kvpb.HelloReply{Session: uint64(id), ArenaPath: o.Arena().Path(), Slots: uint32(g.Slots),
		PayloadSize: uint64(g.PayloadSize), LeaseTtlMs: uint64(o.LeaseTTL().Milliseconds()), OwnedOk: ownedOK, LeasedOk: leasedOK}
	return nil
}

func handleSeal(o *Owner, sid SessionID, s *kvpb.Seal) error {
	key, err := keyFromBytes(s.Key)
	if err != nil {
		return err
	}
	parent, err := keyFromBytes(s.Parent)
	if err != nil {
		return err
	}
	return o.Seal(sid, kvclient.RefFromPB(s.Ref), key, parent)
}

func handleAcquire(o *Owner, sid SessionID, ks *kvpb.Keys, resp *kvpb.Response) error {
	keys, err := keysFromPB(ks)
	if err != nil {
		return err
	}
	refs, err := o.Acquire(sid, keys)
	if err != nil {
		return err
	}
	resp.Refs = kvclient.RefsToPB(refs)
	return nil
}

func statsToPB(s Stats) *kvpb.Stats {
	by := map[string]uint32{}
	for k, v := range s.ByState {
		by[k] = uint32(v)
	}
	return &kvpb.Stats{Slots: uint32(s.Slots), ByState: by, Sessions: uint32(s.Sessions), Leases: uint32(s.Leases), SlotsInUse: uint32(s.SlotsInUse),
		Counters: map[string]uint64{
			"stale_rejects": s.StaleRejects, "stale_deletes": s.StaleDeletes, "checksum_failures": s.ChecksumFailures,
			"corrupt_dropped": s.CorruptDropped, "orphans_reclaimed": s.OrphansReclaimed, "evicted": s.Evicted,
			"dropped_at_startup": s.DroppedAtStartup, "recovered_at_startup": s.RecoveredAtStart,
			"duplicate_publish": s.DuplicatePublish, "sessions_expired": s.SessionsExpired, "writers_reported_dead": s.WritersReportDead,
		}}
}

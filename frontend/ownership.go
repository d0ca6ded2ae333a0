package frontend

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// Each frontend watches the request records: a record of one of its own
// running streams whose owner became another frontend (a higher term)
// means the request was taken over. The local run stops driving it and
// its followers get a final taken_over error naming the new owner.

// takenOver is the cause of a run's end when another frontend took the
// request over.
type takenOver struct{ url string }

func (t *takenOver) Error() string { return "taken over by " + t.url }

// watchRequests follows the records from rev on until ctx ends; a broken
// watch is re-established from the last revision seen, a compacted one
// after re-reading every record.
func (s *Server) watchRequests(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		wch := s.etcd.Watch(clientv3.WithRequireLeader(ctx), schema.RequestsPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		compacted := false
		for resp := range wch {
			if resp.CompactRevision != 0 {
				compacted = true
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					s.checkOwner(string(ev.Kv.Key), ev.Kv.Value)
				}
			}
			rev = resp.Header.Revision
		}
		if sleep(ctx, syncRetry) != nil {
			return
		}
		if compacted {
			if r, err := s.relistRequests(ctx); err == nil {
				rev = r
			}
		}
	}
}

// relistRequests checks every record (after a compaction lost events)
// and returns the revision read.
func (s *Server) relistRequests(ctx context.Context) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	resp, err := s.etcd.Get(gctx, schema.RequestsPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("frontend: re-read request records: %w", err)
	}
	for _, kv := range resp.Kvs {
		s.checkOwner(string(kv.Key), kv.Value)
	}
	return resp.Header.Revision, nil
}

// checkOwner stops the local run of a request whose record names a later
// owner than the term this frontend drives it at. A record of a request
// this frontend does not run (nearly every event, with many frontends)
// costs one map lookup by its key, not a decode.
func (s *Server) checkOwner(key string, value []byte) {
	id, ok := strings.CutPrefix(key, schema.RequestsPrefix)
	if st := s.recorded(id); ok && st != nil {
		if rec, err := schema.DecodeRequestRecord(key, value); err == nil {
			s.checkStream(st, rec)
		}
	}
}

// recorded is the local stream of request id if it has a record.
func (s *Server) recorded(id string) *stream {
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil || st.rec == nil {
		return nil
	}
	return st
}

// checkRecord ends the local run of rec's request if rec says another
// frontend took it over.
func (s *Server) checkRecord(rec schema.RequestRecord) {
	if st := s.recorded(rec.ID); st != nil {
		s.checkStream(st, rec)
	}
}

// checkStream ends st, rec's request here, if rec names a later owner.
func (s *Server) checkStream(st *stream, rec schema.RequestRecord) {
	if rec.Owner == s.opts.ID {
		return
	}
	rs := st.rec
	rs.mu.Lock()
	lost := rs.rev != 0 && rec.Term > rs.rec.Term
	rs.mu.Unlock()
	if lost {
		s.lostTo(st, rec.OwnerURL)
	}
}

// lostTo ends st here: another frontend, at url, took its request over.
// This frontend writes its record no more.
func (s *Server) lostTo(st *stream, url string) {
	if rs := st.rec; rs != nil {
		rs.mu.Lock()
		rs.movedTo = url
		rs.rev = 0
		rs.mu.Unlock()
		s.recs.release(rs)
	}
	st.cancel(&takenOver{url: url})
}

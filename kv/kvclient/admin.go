package kvclient

import (
	"context"
	"time"

	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// AdminClient talks to the owner without a session: stats, sweeps and
// writer deaths (the agent's and operators' operations).
type AdminClient struct{ socket string }

// NewAdminClient returns a client for socket; each call is one connection.
func NewAdminClient(socket string) *AdminClient { return &AdminClient{socket: socket} }

// call sends req on a connection of its own, bounded like a worker's
// first round trip (the owner's TTL is not known here).
func (a *AdminClient) call(ctx context.Context, req *kvpb.Request) (*kvpb.Response, error) {
	w, err := dialWire(ctx, a.socket, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer w.close()
	return w.roundTrip(ctx, req, rttFor(defaultTTL))
}

// Stats returns the owner's counts and counters.
func (a *AdminClient) Stats(ctx context.Context) (*kvpb.Stats, error) {
	resp, err := a.call(ctx, &kvpb.Request{Op: &kvpb.Request_Stats{Stats: &kvpb.Empty{}}})
	if err != nil {
		return nil, err
	}
	return resp.Stats, nil
}

// WriterDead reports a writer's death and returns how many blocks went.
func (a *AdminClient) WriterDead(ctx context.Context, w Writer) (int, error) {
	resp, err := a.call(ctx, &kvpb.Request{Op: &kvpb.Request_WriterDead{WriterDead: &kvpb.WriterDead{InstanceId: w.Instance, Generation: w.Gen}}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Sweep runs one sweep now.
func (a *AdminClient) Sweep(ctx context.Context) (int, error) {
	resp, err := a.call(ctx, &kvpb.Request{Op: &kvpb.Request_Sweep{Sweep: &kvpb.Empty{}}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// Lookup counts the published leading keys.
func (a *AdminClient) Lookup(ctx context.Context, keys []BlockKey) (int, error) {
	resp, err := a.call(ctx, &kvpb.Request{Op: &kvpb.Request_Lookup{Lookup: keysToPB(keys)}})
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

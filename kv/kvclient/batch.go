package kvclient

import (
	"context"
	"fmt"

	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// PublishBatch seals and publishes blocks in one round trip (see
// Owner.PublishBatch) and allocates up to allocate fresh slots in the same
// manifest write. It returns the owner's answer per block (the client then
// leases the published ones) and the fresh slots. err is for the whole
// call: when it is set nothing is known of any block.
func (c *Client) PublishBatch(ctx context.Context, blocks []BatchBlock, allocate int) (BatchResult, error) {
	sp := &kvpb.SealPublish{Allocate: uint32(allocate)}
	for _, b := range blocks {
		sp.Refs = append(sp.Refs, RefToPB(b.Ref))
		sp.Keys = append(sp.Keys, b.Key[:])
		sp.Parents = append(sp.Parents, b.Parent[:])
	}
	resp, err := c.call(ctx, &kvpb.Request{Op: &kvpb.Request_SealPublish{SealPublish: sp}})
	if err != nil {
		return BatchResult{}, err
	}
	if len(resp.Results) != len(blocks) {
		return BatchResult{}, fmt.Errorf("%w: %d results for %d blocks", ErrOwnerUnavailable, len(resp.Results), len(blocks))
	}
	res := BatchResult{Published: make([]Ref, len(blocks)), Errs: make([]error, len(blocks)), Allocated: RefsFromPB(resp.Refs)}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range resp.Results {
		if r.Code != kvpb.Code_OK {
			res.Errs[i] = &RemoteError{Code: r.Code, Message: r.Message}
			continue
		}
		res.Published[i] = RefFromPB(r.Ref)
		delete(c.owned, blocks[i].Ref.Slot)
		c.leased[blocks[i].Ref.Slot] = res.Published[i]
	}
	for _, r := range res.Allocated {
		c.owned[r.Slot] = r
	}
	return res, nil
}

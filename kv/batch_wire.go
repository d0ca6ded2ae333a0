package kv

import (
	"context"
	"fmt"

	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// handleSealPublish answers a SealPublish: per-block results, and the
// slots allocated in the same write.
func handleSealPublish(o *Owner, sid SessionID, sp *kvpb.SealPublish, resp *kvpb.Response) error {
	if len(sp.Keys) != len(sp.Refs) || len(sp.Parents) != len(sp.Refs) {
		return fmt.Errorf("%w: %d refs, %d keys, %d parents", ErrBadRequest, len(sp.Refs), len(sp.Keys), len(sp.Parents))
	}
	blocks := make([]BatchBlock, len(sp.Refs))
	for i, r := range sp.Refs {
		key, err := keyFromBytes(sp.Keys[i])
		if err != nil {
			return err
		}
		parent, err := keyFromBytes(sp.Parents[i])
		if err != nil {
			return err
		}
		blocks[i] = BatchBlock{Ref: fromPB(r), Key: key, Parent: parent}
	}
	res, err := o.PublishBatch(sid, blocks, int(sp.Allocate))
	if err != nil {
		return err
	}
	resp.Results = make([]*kvpb.BlockResult, len(blocks))
	for i, e := range res.Errs {
		if e != nil {
			resp.Results[i] = &kvpb.BlockResult{Code: codeOf(e), Message: e.Error()}
			continue
		}
		resp.Results[i] = &kvpb.BlockResult{Ref: toPB(res.Published[i])}
	}
	resp.Refs = refsToPB(res.Allocated)
	return nil
}

// PublishBatch seals and publishes blocks in one round trip (see
// Owner.PublishBatch) and allocates up to allocate fresh slots in the same
// manifest write. It returns the owner's answer per block (the client then
// leases the published ones) and the fresh slots. err is for the whole
// call: when it is set nothing is known of any block.
func (c *Client) PublishBatch(ctx context.Context, blocks []BatchBlock, allocate int) (BatchResult, error) {
	sp := &kvpb.SealPublish{Allocate: uint32(allocate)}
	for _, b := range blocks {
		sp.Refs = append(sp.Refs, toPB(b.Ref))
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
	res := BatchResult{Published: make([]Ref, len(blocks)), Errs: make([]error, len(blocks)), Allocated: refsFromPB(resp.Refs)}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range resp.Results {
		if r.Code != kvpb.Code_OK {
			res.Errs[i] = &RemoteError{Code: r.Code, Message: r.Message}
			continue
		}
		res.Published[i] = fromPB(r.Ref)
		delete(c.owned, blocks[i].Ref.Slot)
		c.leased[blocks[i].Ref.Slot] = res.Published[i]
	}
	for _, r := range res.Allocated {
		c.owned[r.Slot] = r
	}
	return res, nil
}

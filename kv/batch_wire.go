package kv

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/kv/kvclient"
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
		blocks[i] = BatchBlock{Ref: kvclient.RefFromPB(r), Key: key, Parent: parent}
	}
	res, err := o.PublishBatch(sid, blocks, int(sp.Allocate))
	if err != nil {
		return err
	}
	resp.Results = make([]*kvpb.BlockResult, len(blocks))
	for i, e := range res.Errs {
		if e != nil {
			resp.Results[i] = &kvpb.BlockResult{Code: kvclient.CodeOf(e), Message: e.Error()}
			continue
		}
		resp.Results[i] = &kvpb.BlockResult{Ref: kvclient.RefToPB(res.Published[i])}
	}
	resp.Refs = kvclient.RefsToPB(res.Allocated)
	return nil
}

package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

// ErrReadyUnread ends a worker whose Ready line nobody took: the agent
// that started it died first, so none has it on record to adopt.
var ErrReadyUnread = errors.New("worker: the Ready line could not be written (the agent that started this worker is gone, and none can adopt it): stopping")

// readyLine is what the worker announces once it serves.
func readyLine(opts Options, ln *quic.Listener, e *decode.Engine) workerclient.Ready {
	ready := workerclient.Ready{InstanceID: opts.InstanceID, Generation: opts.Generation, Addr: ln.Addr().String(),
		Model: e.ModelName(), ModelRevision: e.ModelRevision(), NumericsID: e.NumericsID(),
		ContextLen: e.ContextLen(), TokenizerHash: e.Tokenizer.Hash(), Continuation: e.Continuation(),
		Capacity: e.Limits().Capacity(sched.Interactive), BatchCapacity: e.Limits().Capacity(sched.Batch)}
	if e.Cache != nil {
		id := e.Cache.Identity()
		ready.KVIdentity = &id
	}
	return ready
}

// announce writes the Ready line to out: an error wrapping ErrReadyUnread
// when nobody takes it.
func announce(out io.Writer, ready workerclient.Ready) error {
	if err := failpoint.Hit(FailBeforeReady); err != nil {
		return err
	}
	if err := json.NewEncoder(out).Encode(ready); err != nil {
		// Whoever started this worker is gone before it could record it:
		// no agent can adopt it, and serving on would hold its memory for
		// nobody.
		return fmt.Errorf("%w: %w", ErrReadyUnread, err)
	}
	return failpoint.Hit(FailAfterReady)
}

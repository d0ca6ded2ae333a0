package frontend

import (
	"log/slog"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// observer logs and counts what one request's interpreter does; it
// decides nothing.
type observer struct {
	log *slog.Logger
	m   *metrics
	r   *reqfsm.Request
	// tr holds the request's spans (nil: not traced).
	tr *reqTrace
	// revision is an instance's model revision, as registered ("" when
	// unknown), for the logs' model_revision.
	revision func(instanceID string) string
}

// revisionOf is id's model revision for a log line.
func (o observer) revisionOf(id string) string {
	if o.revision == nil {
		return ""
	}
	return o.revision(id)
}

func (o observer) migrating(reason string) {
	r := o.r
	o.log.Warn("migrating", "request_id", r.ID, "request_epoch", r.Epoch, "attempt", r.Migrations,
		"sequence_no", r.Received(), "failure_reason", reason, "recovery_action", "re-prefill elsewhere")
	o.m.migrations.WithLabelValues("attempt").Inc()
	o.tr.migrating(r, reason, time.Now())
}

func (o observer) recovered(took time.Duration) {
	o.m.migrations.WithLabelValues("success").Inc()
	o.m.migrationTime.Observe(took.Seconds())
	o.tr.recovered(o.r.ReusedPositions)
}

// routed counts a routing decision by whether the chosen node's prefix
// summary was used, and held some of the request.
func (o observer) routed(cached int, used bool) {
	o.tr.routed(cached)
	switch {
	case cached > 0:
		o.m.cacheRoutes.WithLabelValues("hit").Inc()
	case used:
		o.m.cacheRoutes.WithLabelValues("miss").Inc()
	default:
		o.m.cacheRoutes.WithLabelValues("load_only").Inc()
	}
}

// notReadyAvoided counts a request not sent to the instance it was
// routed to: the view marked it not ready or draining between the pick
// and the send.
func (o observer) notReadyAvoided(id string) {
	o.log.Info("instance not ready before the send; routing elsewhere", "request_id", o.r.ID, "request_epoch", o.r.Epoch, "instance_id", id)
	o.m.notReadyAvoided.Inc()
}

// drainMigration counts a migration caused by a draining worker.
func (o observer) drainMigration() { o.m.drainMigrations.Inc() }

// takeover: how a request taken over started here (attached,
// regenerated).
func (o observer) takeover(how string) {
	o.m.takeoverStarts.WithLabelValues(how).Inc()
	o.log.Info("frontend: request taken over", "request", o.r.ID, "start", how, "epoch", o.r.Epoch)
}

func (o observer) dispatch(d reqfsm.Dispatch) {
	attempt := o.r.Migrations + 1
	o.tr.dispatched(d, attempt)
	o.log.Info("dispatch", "request_id", o.r.ID, "request_epoch", d.Epoch, "instance_id", d.To.InstanceID,
		"generation", d.To.Generation, "model_revision", o.revisionOf(d.To.InstanceID), "decode_attempt", attempt, "sequence_no", len(d.Prefix))
	o.m.replayedPrefill.Add(float64(len(d.Prefix)))
}

func (o observer) prefill(p reqfsm.Prefill) {
	attempt := o.r.PrefillFailures + 1
	o.tr.prefillSent(p, attempt)
	o.log.Info("prefill", "request_id", o.r.ID, "request_epoch", p.Epoch, "instance_id", p.At.InstanceID, "generation", p.At.Generation,
		"model_revision", o.revisionOf(p.At.InstanceID), "prefill_attempt", attempt)
}

// prefilled: the prefill instance handed the prompt's KV off.
func (o observer) prefilled() { o.tr.prefillDone("") }

func (o observer) prefillFailed() {
	o.tr.prefillDone("prefill instance failed")
	o.m.prefillFailures.Inc()
}

// handOff counts a prefill/decode hand-off by its path.
func (o observer) handOff(path string) { o.m.pd.WithLabelValues(path).Inc() }

func (o observer) transfer(t reqfsm.Transfer) {
	o.tr.transferSent(t)
	o.log.Info("kv transfer", "request_id", o.r.ID, "request_epoch", t.Epoch, "transfer_epoch", t.TransferEpoch,
		"instance_id", t.To.InstanceID, "from_node", t.KV.Node, "blocks", len(t.KV.Keys))
}

func (o observer) transferFailed(why string) {
	o.log.Warn("kv transfer failed; decode recomputes", "request_id", o.r.ID, "request_epoch", o.r.Epoch, "err", why,
		"recovery_action", "recompute")
	o.tr.transferDone(0, why)
	o.handOff("transfer_failed")
}

func (o observer) transferred(bytes uint64) {
	o.tr.transferDone(bytes, "")
	o.handOff("transfer")
	o.m.transferBytes.Add(float64(bytes))
}

// awaitingCapacity logs a request that found no routable instance of its
// model and waits for one until until.
func (o observer) awaitingCapacity(until time.Time) {
	o.log.Info("waiting for capacity", "request_id", o.r.ID, "request_epoch", o.r.Epoch, "sequence_no", o.r.Received(),
		"wait_bound", time.Until(until).Round(time.Millisecond).String())
}

// capacityFound counts a request routed after it waited d for capacity.
func (o observer) capacityFound(d time.Duration) {
	o.log.Info("capacity found", "request_id", o.r.ID, "request_epoch", o.r.Epoch, "waited", d.Round(time.Millisecond).String())
	o.m.capacityWaits.WithLabelValues("served").Inc()
}

func (o observer) finished() {
	r := o.r
	if r.Err != nil {
		o.log.Warn("request failed", "request_id", r.ID, "request_epoch", r.Epoch, "failure_reason", r.Err.Type, "attempt", r.Migrations)
	}
	o.m.settle(r)
	o.tr.finished(r)
}

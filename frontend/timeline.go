package frontend

import "time"

// timeline is when one request's steps happened, by the frontend's clock,
// for its end chunk: those of its last migration, and those of its
// current prefill/decode hand-off. The state machine keeps no wall-clock
// durations; the interpreter marks each point as it carries it out.
type timeline struct {
	// failedAt is when the current migration began (zero when none).
	failedAt time.Time
	// The last migration: the failure seen, the new worker chosen, its
	// stream opened, and the first token committed after it.
	seen, routed, dispatched, recovered time.Time

	// The hand-off: when the prefill, the transfer and the decode were
	// sent, and how long each took (to the blocks published and keys
	// back; to the pull's answer; to the first token).
	prefillSent, transferSent, decodeSent time.Time
	prefill, transfer, decodeFirstToken   time.Duration
}

// migrating marks a migration's route; a re-route of a migration under
// way keeps its start.
func (t *timeline) migrating(now time.Time) {
	if t.inMigration() {
		return
	}
	t.failedAt = now
	t.seen, t.recovered = now, time.Time{}
}

// inMigration reports whether a migration is under way.
func (t *timeline) inMigration() bool { return !t.failedAt.IsZero() }

// markRouted marks the new worker of a migration chosen.
func (t *timeline) markRouted(now time.Time) {
	if t.inMigration() {
		t.routed = now
	}
}

// markDispatched marks the stream to a migration's new worker opened.
func (t *timeline) markDispatched(now time.Time) {
	if t.inMigration() {
		t.dispatched = now
	}
}

// markRecovered marks the first token after a migration and returns how
// long the migration took (false when none was under way).
func (t *timeline) markRecovered(now time.Time) (time.Duration, bool) {
	if !t.inMigration() {
		return 0, false
	}
	took := now.Sub(t.failedAt)
	t.failedAt, t.recovered = time.Time{}, now
	return took, true
}

func (t *timeline) markPrefillSent(now time.Time)  { t.prefillSent = now }
func (t *timeline) markPrefilled(now time.Time)    { t.prefill = now.Sub(t.prefillSent) }
func (t *timeline) markTransferSent(now time.Time) { t.transferSent = now }
func (t *timeline) markTransferred(now time.Time)  { t.transfer = now.Sub(t.transferSent) }
func (t *timeline) markDecodeSent(now time.Time)   { t.decodeSent = now }

// markFirstToken marks the request's first token of a split request; only
// the first one counts.
func (t *timeline) markFirstToken(now time.Time) {
	if t.decodeFirstToken == 0 {
		t.decodeFirstToken = now.Sub(t.decodeSent)
	}
}

// lastMigration is the end chunk's last_migration: unix nanoseconds by
// step, nil when the request never recovered from a migration.
func (t *timeline) lastMigration() map[string]int64 {
	if t.recovered.IsZero() {
		return nil
	}
	return map[string]int64{"failure_seen_unix_ns": t.seen.UnixNano(), "routed_unix_ns": t.routed.UnixNano(),
		"dispatched_unix_ns": t.dispatched.UnixNano(), "first_token_unix_ns": t.recovered.UnixNano()}
}

// pdMs is the end chunk's pd_timeline_ms: milliseconds (to the
// microsecond) by step of the hand-off.
func (t *timeline) pdMs() map[string]float64 {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return map[string]float64{"prefill": ms(t.prefill), "transfer": ms(t.transfer), "decode_first_token": ms(t.decodeFirstToken)}
}

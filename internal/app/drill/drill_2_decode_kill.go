package drill

import (
	"context"
	"fmt"
	"sync"
	"time"
)

func init() {
	Register(Drill{Number: 2, Name: seedNames[2][0], Expect: seedNames[2][1], Shape: Standard, Run: runDecodeKill})
}

// runDecodeKill SIGKILLs the decode worker of stream 0 once a quarter of
// its tokens reached the client, while every stream runs: the streams on
// that worker migrate and must end bit-identical to their fault-free
// references, with no gap or duplicate; RTO is kill → next token.
func runDecodeKill(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: cfg.MaxTokens, Seed: cfg.Seed, Tag: "2"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	kill := KillOnToken(ctx, c, l, r, 0, max(cfg.MaxTokens/4, 1))
	start := time.Now()
	r.Event(start, EvLoadStart, "%d streams × %d tokens", cfg.Streams, cfg.MaxTokens)
	streams := l.Run(ctx)
	r.Event(time.Now(), EvLoadEnd, "")
	k, err := kill()
	if err != nil {
		return err
	}
	if ev, err := c.Detected(ctx, k, 10*time.Second); err == nil {
		r.Event(ev.DetectedAt, EvDetected, "%s exit seen by the agent (%s)", k.InstanceID, ev.Detector)
		r.Figure("detection_ms", ms(ev.DetectedAt.Sub(k.At)))
	}
	rto, lost := Recoveries(streams, k.InstanceID, k.At)
	for _, v := range rto {
		r.Event(k.At.Add(time.Duration(v*float64(time.Millisecond))), EvRecovered, "a stream's next token after %.1f ms", v)
	}
	r.Sample("rto_ms", rto...)
	Latencies(r, streams)
	o := l.Compare(streams)
	figuresOf(r, o)
	c.Traces(ctx, r, streams, 2, "lifeline.decode")
	r.Figure("migrated_streams", float64(len(rto)))
	r.Figure("lost_streams", float64(lost))
	r.Figure("rto_p50_ms", Percentile(rto, 50))
	r.Figure("rto_p99_ms", Percentile(rto, 99))
	if _, err := c.WaitBack(ctx, k.InstanceID, k.Generation, time.Minute); err != nil {
		return err
	}
	var ck Check
	ck.That(len(rto) > 0, "no stream was on the killed worker when it died")
	ck.That(o.Failed == 0 && lost == 0, "%d streams failed (%v), %d lost", o.Failed, o.FirstError, lost)
	ck.That(o.Gaps == 0 && o.Duplicates == 0, "%d gaps, %d duplicates", o.Gaps, o.Duplicates)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("%d streams recovered from the kill of %s (RTO p50 %.0f ms, p99 %.0f ms); all %d bit-identical",
		len(rto), k.InstanceID, Percentile(rto, 50), Percentile(rto, 99), o.Streams))
	return nil
}

// KillOnToken arms l to SIGKILL the worker that serves stream (by index)
// as the token of sequence number seq reaches the client, once; the
// returned function says what was killed after the load ran.
func KillOnToken(ctx context.Context, c *Cluster, l *Load, r *Recorder, stream, seq int) func() (Kill, error) {
	return killOnToken(l, r, stream, seq, func(instance string) (Kill, error) { return c.KillWorker(ctx, instance) },
		func(k Kill) string {
			return fmt.Sprintf("SIGKILL %s (pid %d, generation %d)", k.InstanceID, k.PID, k.Generation)
		}, nil)
}

// killOnToken arms l to run kill, once, on the instance that served
// stream's token seq, records the fault as say describes it and then
// calls after (when not nil); the function returned says what was
// killed.
func killOnToken(l *Load, r *Recorder, stream, seq int, kill func(instance string) (Kill, error), say func(Kill) string, after func(Kill)) func() (Kill, error) {
	var (
		once sync.Once
		k    Kill
		err  = fmt.Errorf("drill: stream %d never reached sequence %d: nothing was killed", stream, seq)
	)
	prev := l.OnToken
	l.OnToken = func(s *Stream, t Tok) {
		if prev != nil {
			prev(s, t)
		}
		if s.Index != stream || t.Seq != seq {
			return
		}
		once.Do(func() {
			k, err = kill(t.Instance)
			if err != nil {
				return
			}
			r.Event(k.At, EvFault, "%s after stream %d's token %d", say(k), stream, seq)
			if after != nil {
				after(k)
			}
		})
	}
	return func() (Kill, error) { return k, err }
}

// figuresOf records an outcome's figures.
func figuresOf(r *Recorder, o Outcome) {
	r.Figure("streams", float64(o.Streams))
	r.Figure("failed", float64(o.Failed))
	r.Figure("gaps", float64(o.Gaps))
	r.Figure("duplicates", float64(o.Duplicates))
	r.Figure("identical", o.IdenticalFraction())
	r.Figure("migrations", float64(o.Migrations))
}

// Package etcdlog holds what every etcd client of ours shares: its
// keep-alives, and its logs (zap) routed into a
// *slog.Logger: each entry at the level it deserves — the client's
// notices of a call it retries, and its informational chatter, are Debug;
// its warnings Warn; its errors Error — with its fields as attributes,
// and repeats of the same message and error within a minute folded into
// the next line that passes, which says how many were folded.
package etcdlog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// KeepAliveTime and KeepAliveTimeout are the etcd clients' gRPC
// keep-alives (clientv3.Config.DialKeepAliveTime, DialKeepAliveTimeout):
// a member cut off silently (a host's link down) is noticed within their
// sum and left for another; TCP alone takes minutes. Not more often:
// etcd refuses pings under 5 s apart (--grpc-keepalive-min-time).
const (
	KeepAliveTime    = 5 * time.Second
	KeepAliveTimeout = 2 * time.Second
)

// Fold is how long a repeated entry is folded into its first.
const Fold = time.Minute

// New is a zap logger for clientv3.Config.Logger that writes to log.
func New(log *slog.Logger) *zap.Logger {
	return zap.New(&core{log: log, seen: &seen{last: map[string]*repeat{}}})
}

type core struct {
	log    *slog.Logger
	fields []zapcore.Field
	seen   *seen
}

// seen remembers the entries emitted within Fold.
type seen struct {
	mu   sync.Mutex
	last map[string]*repeat
}

type repeat struct {
	at     time.Time
	folded int
}

// admit says whether an entry with key at now is emitted, and how many
// were folded since the last one that was.
func (s *seen) admit(key string, now time.Time) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.last[key]
	if r != nil && now.Sub(r.at) < Fold {
		r.folded++
		return false, 0
	}
	folded := 0
	if r != nil {
		folded = r.folded
	}
	if len(s.last) > 1024 { // a bound on distinct keys: forget them all
		clear(s.last)
	}
	s.last[key] = &repeat{at: now}
	return true, folded
}

// retrying is the client's notice of a call it retries (or fails at once,
// as an add of what exists): the caller gets the error, the log need not.
const retrying = "retrying of unary invoker failed"

func level(e zapcore.Entry) slog.Level {
	switch {
	case e.Level >= zapcore.ErrorLevel:
		return slog.LevelError
	case e.Level == zapcore.WarnLevel && e.Message != retrying:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

func (c *core) Enabled(zapcore.Level) bool { return true }

func (c *core) With(fs []zapcore.Field) zapcore.Core {
	return &core{log: c.log, fields: append(append([]zapcore.Field(nil), c.fields...), fs...), seen: c.seen}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.log.Enabled(context.Background(), level(e)) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), c.fields...), fs...) {
		f.AddTo(enc)
	}
	ok, folded := c.seen.admit(e.Message+"\x00"+fmt.Sprint(enc.Fields["error"]), e.Time)
	if !ok {
		return nil
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	if folded > 0 {
		attrs = append(attrs, slog.Int("repeats_folded", folded))
	}
	c.log.LogAttrs(context.Background(), level(e), "etcd client: "+e.Message, attrs...)
	return nil
}

func (c *core) Sync() error { return nil }

package etcdlog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestLevelsFieldsAndFolding: the client's retry notice is Debug (not
// shown at Info), a warning Warn with its fields; the same warning again
// within Fold is folded, and the next one after it says how many were.
func TestLevelsFieldsAndFolding(t *testing.T) {
	var buf bytes.Buffer
	z := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))).With(zap.String("target", "etcd-endpoints://x"))
	z.Warn(retrying, zap.String("error", "role name already exists"))
	now := time.Now()
	for range 5 {
		z.Check(zapcore.WarnLevel, "lease keepalive response queue is full").Write(zap.String("error", "full"))
	}
	c := z.Core().(*core)
	c.Write(zapcore.Entry{Level: zapcore.WarnLevel, Message: "lease keepalive response queue is full", Time: now.Add(2 * Fold)}, []zapcore.Field{zap.String("error", "full")})
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d lines, want the warning and its repeat after Fold:\n%s", len(lines), buf.String())
	}
	if lines[0]["level"] != "WARN" || lines[0]["msg"] != "etcd client: lease keepalive response queue is full" || lines[0]["target"] != "etcd-endpoints://x" || lines[0]["error"] != "full" {
		t.Fatalf("first line %v", lines[0])
	}
	if lines[1]["repeats_folded"] != float64(4) {
		t.Fatalf("second line %v: want 4 repeats folded", lines[1])
	}
}

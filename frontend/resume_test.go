package frontend

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

func TestResumeTokens(t *testing.T) {
	k := newResumeKeys(nil)
	tok := k.Issue("req-1", t0.Add(time.Minute))
	if err := k.Check(tok, "req-1", t0); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		tok, id string
		at      time.Time
	}{
		"other request": {tok, "req-2", t0},
		"expired":       {tok, "req-1", t0.Add(2 * time.Minute)},
		"garbage":       {"!!!", "req-1", t0},
		"truncated":     {tok[:10], "req-1", t0},
		"other key":     {newResumeKeys(nil).Issue("req-1", t0.Add(time.Minute)), "req-1", t0},
		// A key id 255 long: 2+255 wrapped in byte arithmetic to 1 and
		// the slice panicked the handler.
		"key id 255": {longKeyID(255), "req-1", t0},
		"key id 254": {longKeyID(254), "req-1", t0},
	} {
		if err := k.Check(c.tok, c.id, c.at); !errors.Is(err, ErrBadResumeToken) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// longKeyID is a token whose key id is n bytes long, of the right total
// length for that key id.
func longKeyID(n int) string {
	b := append([]byte{tokenVersion, byte(n)}, strings.Repeat("k", n)...)
	return base64.RawURLEncoding.EncodeToString(append(b, make([]byte, 8+sha256.Size)...))
}

func FuzzResumeToken(f *testing.F) {
	k := newResumeKeys([]byte("fixed secret for the fuzzer"))
	f.Add(k.Issue("r", t0.Add(time.Hour)), "r")
	f.Add(longKeyID(255), "r")
	f.Fuzz(func(t *testing.T, tok, id string) {
		if err := k.Check(tok, id, t0); err == nil && k.Issue(id, t0.Add(time.Hour)) != tok {
			// Only a token this key issued for this id may pass.
			t.Fatalf("forged token %q accepted for %q", tok, id)
		}
	})
}

func TestChatTemplate(t *testing.T) {
	p, err := chatTemplate([]ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}})
	if err != nil || p != "system: be brief\nuser: hi\nassistant:" {
		t.Fatalf("%q %v", p, err)
	}
	if _, err := chatTemplate([]ChatMessage{{Role: "wizard", Content: "x"}}); err == nil {
		t.Fatal("unknown role accepted")
	}
}

// TestResumeKeyRotation: tokens of the previous key stay valid after one
// rotation and are refused after the next; a static key is its own.
func TestResumeKeyRotation(t *testing.T) {
	ring := schema.ResumeKeyRing{Keys: []schema.ResumeKey{newResumeKey()}}
	k := &resumeKeys{}
	k.set(ring)
	old := k.Issue("req-1", t0.Add(time.Minute))
	ring = rotated(ring)
	if len(ring.Keys) != 2 {
		t.Fatalf("after one rotation: %d keys", len(ring.Keys))
	}
	k.set(ring)
	if err := k.Check(old, "req-1", t0); err != nil {
		t.Fatalf("the previous key's token after one rotation: %v", err)
	}
	cur := k.Issue("req-1", t0.Add(time.Minute))
	if cur == old {
		t.Fatal("the rotated ring signs with the old key")
	}
	ring = rotated(ring)
	if len(ring.Keys) != 2 {
		t.Fatalf("after two rotations: %d keys", len(ring.Keys))
	}
	k.set(ring)
	if err := k.Check(old, "req-1", t0); !errors.Is(err, ErrBadResumeToken) {
		t.Fatalf("a token two keys old: %v", err)
	}
	if err := k.Check(cur, "req-1", t0); err != nil {
		t.Fatalf("the previous key's token after the second rotation: %v", err)
	}
	b, _ := json.Marshal(ring)
	if _, err := schema.DecodeResumeKeyRing(b); err != nil {
		t.Fatalf("a rotated ring does not decode: %v", err)
	}
	if err := newResumeKeys([]byte("a static secret!")).Check(cur, "req-1", t0); !errors.Is(err, ErrBadResumeToken) {
		t.Fatalf("a static key accepted a ring key's token: %v", err)
	}
}

func TestTermEpochs(t *testing.T) {
	if reqfsm.TermEpoch(1) != 1 {
		t.Fatalf("term 1 starts at %d", reqfsm.TermEpoch(1))
	}
	// Every epoch of term 2 is above any epoch term 1 can reach.
	if reqfsm.TermEpoch(2) <= 1<<32-1 || reqfsm.TermEpoch(3) <= reqfsm.TermEpoch(2)+1<<31 {
		t.Fatalf("term epochs: %d %d", reqfsm.TermEpoch(2), reqfsm.TermEpoch(3))
	}
}

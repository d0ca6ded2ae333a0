package frontend

import (
	"errors"
	"testing"
	"time"
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
	} {
		if err := k.Check(c.tok, c.id, c.at); !errors.Is(err, ErrBadResumeToken) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzResumeToken(f *testing.F) {
	k := newResumeKeys([]byte("fixed secret for the fuzzer"))
	f.Add(k.Issue("r", t0.Add(time.Hour)), "r")
	f.Fuzz(func(t *testing.T, tok, id string) {
		if err := k.Check(tok, id, t0); err == nil && k.Issue(id, t0.Add(time.Hour)) != tok {
			// Only a token this key issued for this id may pass.
			t.Fatalf("forged token %q accepted for %q", tok, id)
		}
	})
}

func TestChatTemplate(t *testing.T) {
	p, err := chatTemplate([]ChatMessage{{"system", "be brief"}, {"user", "hi"}})
	if err != nil || p != "system: be brief\nuser: hi\nassistant:" {
		t.Fatalf("%q %v", p, err)
	}
	if _, err := chatTemplate([]ChatMessage{{"wizard", "x"}}); err == nil {
		t.Fatal("unknown role accepted")
	}
}

package frontend

import (
	"fmt"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// The request machine's test helpers, as its own tests (frontend/reqfsm)
// have them.

var t0 = time.Unix(1_800_000_000, 0)

func has[T reqfsm.Action](acts []reqfsm.Action) (T, bool) {
	for _, a := range acts {
		if v, ok := a.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func frame(r *reqfsm.Request, seq int) reqfsm.Frame {
	return reqfsm.Frame{From: r.Endpoint, Epoch: r.Epoch, SequenceNo: seq, TokenID: 100 + seq, Text: fmt.Sprint(" w", seq)}
}

func start(t *testing.T, r *reqfsm.Request, to string) {
	t.Helper()
	rte, ok := has[reqfsm.Route](r.Start(t0))
	if !ok {
		t.Fatal("Start did not ask for a route")
	}
	if _, ok := has[reqfsm.Dispatch](r.Routed(rte.Epoch, reqfsm.Endpoint{InstanceID: to, Generation: 1}, t0)); !ok {
		t.Fatal("Routed did not dispatch")
	}
}

func logOf(toks []reqfsm.Token) reqfsm.TokenLog {
	var l reqfsm.TokenLog
	for _, t := range toks {
		l.Add(t)
	}
	return l
}

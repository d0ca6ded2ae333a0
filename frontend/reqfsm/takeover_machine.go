package reqfsm

import (
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// The request machine's part of a takeover: a request driven by a later
// owner (term) runs at epochs above every epoch of the earlier ones, and
// a request this frontend lost to another ends with a typed error.

// TermEpoch is the first request epoch of an owner at term: (term-1)<<32
// | 1. The admitting frontend (term 1) counts epochs from 1 as before;
// every epoch of a later owner is above every epoch of an earlier one, so
// a worker or frontend comparing epochs sees the later owner as newer.
func TermEpoch(term uint64) uint64 { return (term-1)<<32 | 1 }

// NewTakenOverRequest is a request this frontend took over at term: it
// starts from nothing (phase 1 regenerates) at the term's first epoch.
func NewTakenOverRequest(r *Request, term uint64) *Request {
	r.Epoch = TermEpoch(term)
	return r
}

// Attached: a takeover found the request's sequence on its worker at
// `at` and attached to it at the current epoch; its frames (from
// sequence 1) come as any decode stream's.
func (r *Request) Attached(at Endpoint, now time.Time) []Action {
	if r.State != Admitted {
		return nil
	}
	r.Endpoint, r.State, r.lastFrame = at, Decoding, now
	return nil
}

// TakenOver ends the request because another frontend, at ownerURL, took
// it over: its worker calls end, and nothing more is committed here.
func (r *Request) TakenOver(ownerURL string) []Action {
	switch {
	case r.State.Terminal():
		return nil
	case r.State == Cancelling:
		return r.CancelDone()
	}
	if ownerURL == "" {
		return r.fail(openai.ErrTakenOver, "another frontend took the request over: resume at any frontend")
	}
	return r.fail(openai.ErrTakenOver, "another frontend took the request over: resume at "+ownerURL)
}

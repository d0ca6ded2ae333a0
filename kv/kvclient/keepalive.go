package kvclient

import (
	"context"
	"errors"
	"time"

	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// keepAlive renews the session on its own connection, so that a slow call
// on the main one never delays a renewal, and fences the client when
// renewals stop being acknowledged. It runs until ctx ends (Close).
func (c *Client) keepAlive(ctx context.Context) {
	defer close(c.done)
	c.mu.Lock()
	ttl := c.ttl()
	c.mu.Unlock()
	t := time.NewTicker(max(ttl/6, 5*time.Millisecond))
	defer t.Stop()
	var w *wire
	defer func() {
		if w != nil {
			w.close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		session := c.hello.GetSession()
		deadline := c.validUntil
		abandoned := session == c.abandoned
		c.mu.Unlock()
		if abandoned {
			// A new session takes over what we still hold, and this one,
			// no longer renewed, expires with what we gave up.
			c.reconnect(ctx)
			c.mu.Lock()
			replaced := c.hello.GetSession() != session
			c.mu.Unlock()
			if replaced {
				continue
			}
			// None yet: renew this one meanwhile. Expired with no other
			// session of this writer, it would have the agent fence
			// (kill) the worker, for what was maybe a slow call.
		}
		sent := time.Now()
		var err error
		w, err = c.renew(ctx, w, session, ttl)
		c.mu.Lock()
		switch {
		case c.hello.GetSession() != session || (errors.Is(err, ErrUnknownSession) && session == c.replacing):
			// A hello replaced the session meanwhile, or one under way
			// names it and the owner ended it already: the answer is
			// about a session we no longer hold.
			c.mu.Unlock()
		case err == nil:
			c.validUntil = sent.Add(ttl - c.margin())
			c.unreachable = false
			c.mu.Unlock()
		case errors.Is(err, ErrUnknownSession) || time.Now().After(deadline):
			// The session is gone or may be: give everything up now and
			// start a new session (this one is abandoned: once replaced,
			// it is not renewed, and what we gave up goes with it).
			lost := c.forgetAllLocked()
			c.validUntil = time.Time{}
			c.mu.Unlock()
			c.reportLost(lost)
			c.reconnect(ctx)
		default:
			c.mu.Unlock()
		}
	}
}

// Fence gives up every block at once if the lease can no longer be proven
// (no renewal acknowledged in time), without waiting for the keepalive
// goroutine, whose renewal may itself be stuck on a frozen owner: the
// owner may hand those slots to another writer from then on. It reports
// them through OnLost and returns how many there were. The session is
// abandoned with them: once a new one is open, it is not renewed, and the
// owner frees those slots when it expires.
func (c *Client) Fence() int {
	c.mu.Lock()
	if c.validUntil.IsZero() || time.Now().Before(c.validUntil) {
		c.mu.Unlock()
		return 0
	}
	lost := c.forgetAllLocked()
	c.mu.Unlock()
	c.reportLost(lost)
	return len(lost)
}

// renew sends one keepalive for session on w, dialing a new connection if
// w is nil, and returns the connection to use next time (nil once broken).
func (c *Client) renew(ctx context.Context, w *wire, session uint64, ttl time.Duration) (*wire, error) {
	if w == nil {
		var err error
		if w, err = dialWire(ctx, c.socket, ttl/3); err != nil {
			return nil, err
		}
	}
	_, err := w.roundTrip(ctx, &kvpb.Request{Op: &kvpb.Request_KeepAlive{KeepAlive: &kvpb.KeepAlive{Session: session}}}, rttFor(ttl))
	if w.closed {
		return nil, err
	}
	return w, err
}

// reconnect opens a new session on the main connection once the line is
// free; a failure is left for the next call to retry.
func (c *Client) reconnect(ctx context.Context) {
	if c.acquire(ctx) != nil {
		return
	}
	lost, _ := c.connect(ctx)
	c.release()
	c.reportLost(lost)
}

package route

import "time"

// An endpoint that failed a request (Fail), or refused one because its
// agent could not prove its lease (Fenced), is avoided by every request
// of this frontend for a while: it is suppressed.

// suppression avoids one endpoint: the instance at generations up to gen.
// A restart comes back at a higher generation, a new endpoint that is not
// suppressed.
type suppression struct {
	gen   uint64
	until time.Time
	// fenced: the instance refused because its agent could not prove its
	// lease; its next registration (the lease renewed) ends the
	// suppression.
	fenced bool
}

// Suppress avoids an endpoint (instance id at generations up to gen)
// locally for SuppressFor.
func (rt *Router) Suppress(id string, gen uint64, now time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.suppress(id, gen, now)
}

func (rt *Router) suppress(id string, gen uint64, now time.Time) {
	rt.suppressed[id] = suppression{gen: gen, until: now.Add(rt.SuppressFor)}
}

// Fenced avoids an endpoint whose worker refused a request because its
// agent could not prove its lease: until the instance registers again
// (its agent renewed the lease) or SuppressFor passes.
func (rt *Router) Fenced(id string, gen uint64, now time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if sup, ok := rt.suppressed[id]; ok && !sup.fenced && sup.gen >= gen && now.Before(sup.until) {
		return // it failed a request: avoided for the whole SuppressFor
	}
	rt.suppressed[id] = suppression{gen: gen, until: now.Add(rt.SuppressFor), fenced: true}
}

// NextLift is when the first suppression in force at now ends (zero when
// none is): a request waiting for capacity looks again then.
func (rt *Router) NextLift(now time.Time) time.Time {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var first time.Time
	for _, sup := range rt.suppressed {
		if sup.until.After(now) && (first.IsZero() || sup.until.Before(first)) {
			first = sup.until
		}
	}
	return first
}

// suppressedLocked reports whether in's endpoint is avoided now, and
// forgets a suppression that has ended.
func (rt *Router) suppressedLocked(in Instance, now time.Time) bool {
	sup, ok := rt.suppressed[in.ID]
	if ok && !now.Before(sup.until) {
		delete(rt.suppressed, in.ID)
		return false
	}
	return ok && in.Generation <= sup.gen
}

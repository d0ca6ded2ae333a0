package reqfsm

import (
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// A request that finds no routable instance of its model waits for one:
// its instances may be starting, or all restarting after a crash, and a
// registration is a second away. The machine decides whether to wait and
// until when; the interpreter waits on the registry.

// AwaitCapacity asks the I/O layer to wait until an instance of the
// request's model registers, or Until passes, and then to answer
// CapacityChanged.
type AwaitCapacity struct {
	Epoch uint64
	Until time.Time
}

func (AwaitCapacity) isAction() {}

// route is the Route of the current epoch, away from every endpoint that
// failed the request.
func (r *Request) route() Route {
	return Route{Epoch: r.Epoch, Exclude: r.FailedInstances, Generations: r.FailedGenerations}
}

// excludeEndpoint records that at failed the request.
func (r *Request) excludeEndpoint(at Endpoint) {
	if at.InstanceID == "" {
		return
	}
	r.FailedInstances[at.InstanceID] = true
	r.FailedGenerations[at.InstanceID] = max(r.FailedGenerations[at.InstanceID], at.Generation)
}

// Exclusion is the router's form of Route's exclusions.
func (a Route) Exclusion() route.Exclusion { return exclusion(a.Exclude, a.Generations) }

// Exclusion is the router's form of RoutePrefill's exclusions.
func (a RoutePrefill) Exclusion() route.Exclusion { return exclusion(a.Exclude, a.Generations) }

func exclusion(ids map[string]bool, gens map[string]uint64) route.Exclusion {
	e := route.ExcludeAll(ids)
	for id, g := range gens {
		if _, ok := e[id]; ok {
			e[id] = g
		}
	}
	return e
}

// NoRoute: nothing can serve the request now. Busy instances (overloaded)
// fail it at once, to be retried by the client (429); so does a migration
// away from a draining node (draining, 503). Otherwise it waits
// for capacity until Policy.CapacityWait after the wait began, or its
// deadline, whichever is first; past that it fails with no_capacity.
func (r *Request) NoRoute(epoch uint64, overloaded bool, now time.Time) []Action {
	if epoch != r.Epoch || !r.State.running() {
		return nil
	}
	if overloaded {
		return r.fail(openai.ErrOverloaded, "every instance that can serve the request is at its limit")
	}
	if r.drainMigration {
		return r.fail(openai.ErrDraining, fmt.Sprintf("the node serving the request drains and no other instance serves its model (after %d tokens)", r.Received()))
	}
	if r.waitingSince.IsZero() {
		r.waitingSince = now
	}
	until := r.waitingSince.Add(r.Policy.CapacityWait)
	if !r.Deadline.IsZero() && r.Deadline.Before(until) {
		until = r.Deadline
	}
	if !now.Before(until) {
		return r.fail(openai.ErrNoCapacity, fmt.Sprintf("no instance can serve the request (waited %v for one)", now.Sub(r.waitingSince).Round(time.Millisecond)))
	}
	return []Action{AwaitCapacity{Epoch: r.Epoch, Until: until}}
}

// CapacityChanged: an instance registered while the request of epoch
// waited, or its wait's bound passed; route again (a NoRoute past the
// bound fails it).
func (r *Request) CapacityChanged(epoch uint64) []Action {
	if epoch != r.Epoch || r.waitingSince.IsZero() || !r.State.running() {
		return nil
	}
	return []Action{r.route()}
}

// endWait ends a wait for capacity on a route, adding its length to
// CapacityWaited; a migration that found a route is no longer the
// drain's to end.
func (r *Request) endWait(now time.Time) {
	if !r.waitingSince.IsZero() {
		r.CapacityWaited += now.Sub(r.waitingSince)
		r.waitingSince = time.Time{}
	}
	r.drainMigration = false
}

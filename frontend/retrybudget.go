package frontend

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// retryBudgets are a frontend's buckets, one per priority, with their
// series.
type retryBudgets map[string]*reqfsm.RetryBudget

func newRetryBudgets(reg *prometheus.Registry) retryBudgets {
	b := retryBudgets{}
	for _, p := range []string{route.PriorityInteractive, route.PriorityBatch} {
		rb := reqfsm.NewRetryBudget(reqfsm.DefaultRetryBudget.Max, reqfsm.DefaultRetryBudget.Ratio)
		b[p] = rb
		l := prometheus.Labels{"priority": p}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_frontend_retry_amplification", ConstLabels: l,
				Help: "Worker attempts (first attempts plus retries and migrations) divided by requests."}, rb.Amplification),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_frontend_retry_budget_tokens", ConstLabels: l,
				Help: "Tokens left in the frontend's retry budget."}, rb.Tokens),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_frontend_attempts_total", ConstLabels: prometheus.Labels{"priority": p, "attempt": "first"},
				Help: "Decode worker attempts of requests: their first, or a further one (re-route, migration)."}, func() float64 { return float64(rb.Counters().Attempts) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_frontend_attempts_total", ConstLabels: prometheus.Labels{"priority": p, "attempt": "retry"},
				Help: "Decode worker attempts of requests: their first, or a further one (re-route, migration)."}, func() float64 { return float64(rb.Counters().Again) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_frontend_retries_total", ConstLabels: prometheus.Labels{"priority": p, "result": "spent"},
				Help: "Retries on another worker (re-routes after overload, migrations), by whether the retry budget allowed them."}, func() float64 { return float64(rb.Counters().Spent) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_frontend_retries_total", ConstLabels: prometheus.Labels{"priority": p, "result": "refused"},
				Help: "Retries on another worker (re-routes after overload, migrations), by whether the retry budget allowed them."}, func() float64 { return float64(rb.Counters().Refused) }),
		)
	}
	return b
}

// of is the budget of a request of priority p.
func (b retryBudgets) of(p string) *reqfsm.RetryBudget {
	if p == route.PriorityBatch {
		return b[route.PriorityBatch]
	}
	return b[route.PriorityInteractive]
}

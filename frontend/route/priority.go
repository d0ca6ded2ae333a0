package route

// Priorities of a request (the Lifeline-Priority header or the body's
// priority field): interactive (the default) or batch. Each has its own
// retry budget at a frontend, so that a batch flood's retries never spend
// what interactive requests need; workers admit interactive requests
// first and keep a share of their slots, KV blocks and queue for them.
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
)

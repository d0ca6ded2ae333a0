package agent

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// collector exports what the agent reads at each scrape rather than
// counts as it goes: its workers' processes (they serve no metrics of
// their own: memory, CPU, descriptors, threads, from /proc) and their
// load against what they hold (queue saturation).
type collector struct {
	a *Agent

	rss, cpu, fds, threads    *prometheus.Desc
	running, queued, capacity *prometheus.Desc
}

func newCollector(a *Agent) *collector {
	inst := []string{"instance_id"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{a: a,
		rss:      d("lifeline_agent_worker_resident_memory_bytes", "A worker process's resident memory.", inst...),
		cpu:      d("lifeline_agent_worker_cpu_seconds_total", "A worker process's user and system CPU time.", inst...),
		fds:      d("lifeline_agent_worker_open_fds", "A worker process's open file descriptors.", inst...),
		threads:  d("lifeline_agent_worker_threads", "A worker process's OS threads.", inst...),
		running:  d("lifeline_agent_worker_running_requests", "Requests a worker runs, as it last reported (canary look or registration update).", inst...),
		queued:   d("lifeline_agent_worker_queued_requests", "Requests waiting in a worker's queue, as it last reported.", inst...),
		capacity: d("lifeline_agent_worker_capacity_requests", "The most requests a worker holds at once (running + queued, interactive): queue saturation is (running + queued) ÷ this.", inst...),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rss, c.cpu, c.fds, c.threads, c.running, c.queued, c.capacity} {
		ch <- d
	}
}

// workerLoad is what Collect reads of an instance under the agent's lock.
type workerLoad struct {
	id                        string
	pid                       int
	running, queued, capacity int
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	a.mu.Lock()
	ws := make([]workerLoad, 0, len(a.instances))
	for id, inst := range a.instances {
		ws = append(ws, workerLoad{id: id, pid: inst.pid, running: inst.running, queued: inst.queued, capacity: inst.capacity})
	}
	a.mu.Unlock()
	sort.Slice(ws, func(i, j int) bool { return ws[i].id < ws[j].id })
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, w := range ws {
		gauge(c.running, float64(w.running), w.id)
		gauge(c.queued, float64(w.queued), w.id)
		if w.capacity > 0 {
			gauge(c.capacity, float64(w.capacity), w.id)
		}
		if w.pid <= 0 {
			continue
		}
		p, err := procfs.NewProc(w.pid)
		if err != nil {
			continue // gone between the snapshot and now
		}
		if st, err := p.Stat(); err == nil {
			gauge(c.rss, float64(st.ResidentMemory()), w.id)
			ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, st.CPUTime(), w.id)
			gauge(c.threads, float64(st.NumThreads), w.id)
		}
		if n, err := p.FileDescriptorsLen(); err == nil {
			gauge(c.fds, float64(n), w.id)
		}
	}
}

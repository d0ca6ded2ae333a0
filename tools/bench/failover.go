package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// The frontend failover bench: a frontend SIGKILLed mid-stream → the next
// token at the client (client library with two frontend URLs), over
// HTTP/3 with 0-RTT resume and over HTTP/2, beside the RTO of a decode
// worker's SIGKILL in the same run; and the cost of the request records
// (throughput and etcd writes per request, records on vs off).

// failoverFront is a frontend the bench kills and restarts on one port.
type failoverFront struct {
	listen string
	proc   *localcluster.Frontend
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (f *failoverFront) start(env *localcluster.Env, id string) error {
	p, err := env.StartFrontend(f.listen, nil, "--tls", "--id", id)
	if err != nil {
		return err
	}
	f.proc = p
	return nil
}

func (f *failoverFront) url() string { return "https://" + f.listen }

func benchRequest(k int) client.Request {
	temp := 0.9
	return client.Request{Model: "small", Prompt: fmt.Sprintf("Failover run %d began when", k), MaxTokens: 48, Temperature: &temp, Seed: uint64(100 + k), IgnoreEOS: true}
}

// streamWithKill streams req through c and runs kill when the token of
// sequence number at arrives; it returns the time from kill to the next
// token and the stream's token ids.
func streamWithKill(c *client.Client, req client.Request, at int, kill func() time.Time) (time.Duration, []int, error) {
	var killed time.Time
	var gap time.Duration
	var ids []int
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Stream(ctx, req, func(tok client.Token) {
		ids = append(ids, tok.TokenID)
		switch tok.SequenceNo {
		case at:
			killed = kill()
		case at + 1:
			gap = time.Since(killed)
		}
	})
	return gap, ids, err
}

func sameIDs(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func runFailoverBench(kills int) error {
	fmt.Printf("## Frontend failover (small preset, 2 nodes × 1 worker, 2 TLS frontends; real processes)\n\n")
	c, err := startBenchCluster(256)
	if err != nil {
		return err
	}
	defer c.close()
	ca, err := pki.Load(c.env.Certs, "h2")
	if err != nil {
		return err
	}
	roots := &tls.Config{RootCAs: ca.RootCAs, ServerName: "localhost"}
	fronts := make([]*failoverFront, 2)
	for i := range fronts {
		listen, err := freePort()
		if err != nil {
			return err
		}
		fronts[i] = &failoverFront{listen: listen}
		if err := fronts[i].start(c.env, fmt.Sprintf("F%d", i)); err != nil {
			return err
		}
	}
	defer func() {
		for _, f := range fronts {
			f.proc.Stop(10 * time.Second)
		}
	}()
	const at = 12
	refs := map[int][]int{}
	ref := func(k int) ([]int, error) {
		if ids, ok := refs[k]; ok {
			return ids, nil
		}
		rc := client.NewWith(client.Options{TLS: roots}, fronts[0].url(), fronts[1].url())
		defer rc.Close()
		_, ids, err := streamWithKill(rc, benchRequest(k), -1, nil)
		refs[k] = ids
		return ids, err
	}
	type row struct {
		gaps                 []time.Duration
		zeroRTT, diverged, n int
	}
	frontendKills := func(h3 bool) (row, error) {
		var r row
		for k := 0; k < kills; k++ {
			want, err := ref(k)
			if err != nil {
				return r, err
			}
			primary, other := fronts[k%2], fronts[(k+1)%2]
			cl := client.NewWith(client.Options{TLS: roots, H3: h3}, primary.url(), other.url())
			gap, ids, err := streamWithKill(cl, benchRequest(k), at, func() time.Time {
				t := time.Now()
				primary.proc.Signal(syscall.SIGKILL)
				return t
			})
			r.zeroRTT += int(cl.Stats().ZeroRTTResumes)
			cl.Close()
			if err != nil {
				return r, fmt.Errorf("kill %d: %w", k, err)
			}
			r.n++
			r.gaps = append(r.gaps, gap)
			if !sameIDs(ids, want) {
				r.diverged++
			}
			<-primary.proc.Exited()
			if err := primary.start(c.env, fmt.Sprintf("F%d", k%2)); err != nil {
				return r, err
			}
		}
		return r, nil
	}
	workerKills := func() (row, error) {
		var r row
		gens := map[string]uint64{}
		for id, reg := range c.regs {
			gens[id] = reg.Generation
		}
		for k := 0; k < kills; k++ {
			want, err := ref(k)
			if err != nil {
				return r, err
			}
			cl := client.NewWith(client.Options{TLS: roots}, fronts[0].url(), fronts[1].url())
			victim := ""
			var ids []int
			var gap time.Duration
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			var killed time.Time
			_, err = cl.Stream(ctx, benchRequest(k), func(tok client.Token) {
				ids = append(ids, tok.TokenID)
				switch tok.SequenceNo {
				case at:
					victim = tok.Instance
					killed = c.kill(victim)
				case at + 1:
					gap = time.Since(killed)
				}
			})
			cancel()
			cl.Close()
			if err != nil {
				return r, fmt.Errorf("worker kill %d: %w", k, err)
			}
			r.n++
			r.gaps = append(r.gaps, gap)
			if !sameIDs(ids, want) {
				r.diverged++
			}
			wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
			reg, err := c.env.WaitRegistration(wctx, victim, gens[victim])
			wcancel()
			if err != nil {
				return r, err
			}
			gens[victim] = reg.Generation
		}
		return r, nil
	}
	h3, err := frontendKills(true)
	if err != nil {
		return fmt.Errorf("HTTP/3: %w", err)
	}
	h2, err := frontendKills(false)
	if err != nil {
		return fmt.Errorf("HTTP/2: %w", err)
	}
	wk, err := workerKills()
	if err != nil {
		return err
	}
	fmt.Printf("| SIGKILL at sequence %d → next token at the client | kills | p50 | p99 | resumes as 0-RTT | streams not bit-identical |\n|---|---|---|---|---|---|\n", at)
	fmt.Printf("| frontend, HTTP/3 (client resumes on the other frontend, 0-RTT) | %d | %v | %v | %d | %d |\n", h3.n, pct(h3.gaps, 50), pct(h3.gaps, 99), h3.zeroRTT, h3.diverged)
	fmt.Printf("| frontend, HTTP/2 over TLS | %d | %v | %v | — | %d |\n", h2.n, pct(h2.gaps, 50), pct(h2.gaps, 99), h2.diverged)
	fmt.Printf("| decode worker (baseline: migration inside the frontend) | %d | %v | %v | — | %d |\n", wk.n, pct(wk.gaps, 50), pct(wk.gaps, 99), wk.diverged)
	fmt.Printf("| frontend kill ÷ worker kill, p50 | | HTTP/3 **%.2f×**, HTTP/2 **%.2f×** | | | |\n\n",
		float64(pct(h3.gaps, 50))/float64(pct(wk.gaps, 50)), float64(pct(h2.gaps, 50))/float64(pct(wk.gaps, 50)))
	return recordsCost(c)
}

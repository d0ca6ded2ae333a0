package workerclient

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/pkitest"
)

// TestWorkerEndpointRoleChecks: a worker's endpoint accepts frontends and
// its own node's agent only; every other certificate of the cluster (and
// any of another CA) is refused in the handshake, with an error naming the
// role presented and the roles accepted, which the worker hears too.
func TestWorkerEndpointRoleChecks(t *testing.T) {
	certs := pkitest.New(t)
	const inst = "n1-decode-tiny-0"
	var (
		mu       sync.Mutex
		refusals []error
	)
	conf, self, err := ServerTLS(certs.Dir(t, pki.Worker("n1", inst)), func(err error) {
		mu.Lock()
		defer mu.Unlock()
		refusals = append(refusals, err)
	})
	if err != nil || self != pki.Worker("n1", inst) {
		t.Fatalf("ServerTLS: %v %v", self, err)
	}
	addr, accepted := pkitest.Serve(t, conf)
	// Each client dials and asks for health as Dial's callers do: a
	// refusal arrives on the first stream (the client's side of the
	// handshake is done first).
	dial := func(dir string) error {
		c, err := ClientTLS(dir)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		wc, err := Dial(ctx, addr, c, inst, 1)
		if err != nil {
			return err
		}
		defer wc.Close()
		health := make(chan error, 1)
		go func() { _, err := wc.Health(ctx); health <- err }()
		select {
		case <-accepted:
			return nil
		case err := <-health:
			return err
		}
	}
	for _, id := range []pki.Identity{pki.Frontend("f1"), pki.Agent("n1")} {
		if err := dial(certs.Dir(t, id)); err != nil {
			t.Errorf("%s refused: %v", id, err)
		}
	}
	for _, id := range []pki.Identity{pki.Agent("n2"), pki.Worker("n1", "n1-decode-tiny-1"), pki.Worker("n2", "n2-decode-tiny-0"), pki.Etcd("e"), pki.Admin("a")} {
		err := dial(certs.Dir(t, id))
		if !errors.Is(err, pki.ErrRefused) || !strings.Contains(err.Error(), "refused this certificate, "+id.String()+"; it accepts frontend, agent of node n1") {
			t.Errorf("%s: %s", id, pkitest.Describe(err))
		}
	}
	if err := dial(pkitest.New(t).Dir(t, pki.Frontend("f1"))); !pkitest.Refused(err) {
		t.Errorf("another CA's frontend: %s", pkitest.Describe(err))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refusals) != 5 || !strings.Contains(refusals[0].Error(), "peer presented agent:n2; this endpoint accepts frontend, agent of node n1") {
		t.Errorf("the worker heard %d refusals: %v", len(refusals), refusals)
	}
}

// TestClientExpectsTheInstanceItDials: a client refuses a server that is
// not the worker of the instance it dials, whatever else it is.
func TestClientExpectsTheInstanceItDials(t *testing.T) {
	certs := pkitest.New(t)
	fe, err := ClientTLS(certs.Dir(t, pki.Frontend("f1")))
	if err != nil {
		t.Fatal(err)
	}
	for _, server := range []pki.Identity{pki.Worker("n1", "n1-decode-tiny-1"), pki.Worker("n2", "n2-decode-tiny-0"), pki.Agent("n1"), pki.Frontend("f2")} {
		// A server that accepts anyone: only the client's check can refuse.
		conf, err := pki.Load(certs.Dir(t, server), ALPN)
		if err != nil {
			t.Fatal(err)
		}
		addr, accepted := pkitest.Serve(t, conf)
		err = pkitest.Handshake(addr, ExpectWorker(fe, "n1-decode-tiny-0"), accepted)
		if err == nil || !strings.Contains(err.Error(), "peer presented "+server.String()+"; this endpoint accepts worker n1-decode-tiny-0") {
			t.Errorf("server %s: %s", server, pkitest.Describe(err))
		}
	}
}

// BenchmarkWorkerHandshake is the cost of a new worker connection (a full
// QUIC + TLS 1.3 handshake with client certificates on loopback, through
// the server's Accept) with the role checks on both ends and without.
func BenchmarkWorkerHandshake(b *testing.B) {
	certs := pkitest.New(b)
	const inst = "n1-decode-tiny-0"
	plainServer, err := pki.Load(certs.Dir(b, pki.Worker("n1", inst)), ALPN)
	if err != nil {
		b.Fatal(err)
	}
	checkedServer, _, err := ServerTLS(certs.Dir(b, pki.Worker("n1", inst)), nil)
	if err != nil {
		b.Fatal(err)
	}
	client, err := ClientTLS(certs.Dir(b, pki.Frontend("f1")))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		server, client *tls.Config
	}{
		{"no-role-check", plainServer, client},
		{"role-checked", checkedServer, ExpectWorker(client, inst)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			addr, accepted := pkitest.Serve(b, tc.server)
			b.ResetTimer()
			for range b.N {
				if err := pkitest.Handshake(addr, tc.client, accepted); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

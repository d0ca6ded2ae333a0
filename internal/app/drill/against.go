package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// AgainstOptions name an existing cluster.
type AgainstOptions struct {
	// URLs are the frontends (at least one); MetricsURLs their metrics
	// listeners (`lifeline frontend --metrics-addr`), in the same order.
	URLs        []string
	MetricsURLs []string
	// Debugs are the frontends' debug sockets (`lifeline frontend
	// --debug-socket`; paths, or "unix:PATH"), in the same order:
	// optional, for traces in the report and goroutines by stack.
	Debugs []string
	// Sockets are the agents' control sockets (at least one; the agents
	// must run on this host for a drill to kill their workers).
	Sockets []string
	// Etcd are etcd's endpoints (optional: without them, routing is
	// judged from the agents' view).
	Etcd    []string
	EtcdTLS bool
	// Certs is the certificate directory (etcd's mutual TLS, workers'
	// health).
	Certs string
	// Model is what loads ask for (default: the first model the first
	// frontend lists).
	Model string
}

// Connect reaches an existing cluster: it acts on it only through its
// frontends' APIs, its agents' sockets and (when given) etcd.
func Connect(ctx context.Context, o AgainstOptions) (*Cluster, error) {
	if len(o.URLs) == 0 {
		return nil, errors.New("drill: --against: no frontend URL")
	}
	if len(o.Sockets) == 0 {
		return nil, errors.New("drill: --against needs the agents' control sockets (--agent-socket)")
	}
	c := &Cluster{Sockets: o.Sockets, Model: o.Model, Certs: o.Certs}
	for _, u := range o.URLs {
		c.URLs = append(c.URLs, strings.TrimRight(u, "/"))
	}
	for _, u := range o.MetricsURLs {
		c.MetricsURLs = append(c.MetricsURLs, strings.TrimSuffix(strings.TrimRight(u, "/"), "/metrics"))
	}
	for _, d := range o.Debugs {
		c.Debugs = append(c.Debugs, debugsock.Base(strings.TrimPrefix(d, debugsock.Scheme)))
	}
	if c.Model == "" {
		m, err := firstModel(ctx, c.URLs[0])
		if err != nil {
			return nil, err
		}
		c.Model = m
	}
	if len(o.Etcd) > 0 {
		cfg := clientv3.Config{Endpoints: o.Etcd, DialTimeout: 5 * time.Second}
		if o.EtcdTLS {
			tlsConf, err := pki.Load(o.Certs, "h2")
			if err != nil {
				return nil, fmt.Errorf("drill: etcd TLS: %w", err)
			}
			cfg.TLS = tlsConf
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("drill: etcd: %w", err)
		}
		c.Etcd = cli
		c.closers = append(c.closers, func() { cli.Close() })
	}
	return c, nil
}

// firstModel asks a frontend for the models it serves.
func firstModel(ctx context.Context, url string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("drill: %s: %w", url, err)
	}
	defer resp.Body.Close()
	var out struct{ Data []struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Data) == 0 {
		return "", fmt.Errorf("drill: %s lists no model (%v): give --model", url, err)
	}
	return out.Data[0].ID, nil
}

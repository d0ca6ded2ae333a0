package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Env is the ground a local cluster stands on: a directory, the cluster's
// certificates, an embedded etcd that requires them, a client of it, and
// the lifeline binary every child process runs.
type Env struct {
	Dir    string
	Binary string
	Certs  string
	Etcd   *embedetcd.Server
	Client *clientv3.Client
}

// NewEnv creates certificates under dir (unless certs names existing
// ones) and starts an embedded etcd in dir/etcd.
func NewEnv(dir, binary, certs string) (_ *Env, err error) {
	if binary == "" {
		if binary, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, Binary: binary, Certs: certs}
	if e.Certs == "" {
		e.Certs = filepath.Join(dir, "certs")
		if err := pki.Init(e.Certs, nil); err != nil {
			return nil, err
		}
	}
	if e.Etcd, err = embedetcd.Start(filepath.Join(dir, "etcd"), 0, e.Certs); err != nil {
		return nil, err
	}
	tlsConf, err := pki.Load(e.Certs, "h2")
	if err == nil {
		e.Client, err = clientv3.New(clientv3.Config{Endpoints: []string{e.Etcd.Endpoint}, DialTimeout: 5 * time.Second, TLS: tlsConf})
	}
	if err != nil {
		e.Etcd.Close()
		return nil, fmt.Errorf("localcluster: etcd client: %w", err)
	}
	return e, nil
}

// Close stops the etcd client and server.
func (e *Env) Close() {
	if e.Client != nil {
		e.Client.Close()
	}
	if e.Etcd != nil {
		e.Etcd.Close()
	}
}

// WaitRegistration waits until instance is registered ready at a
// generation above after, and returns its registration.
func (e *Env) WaitRegistration(ctx context.Context, instance string, after uint64) (schema.Registration, error) {
	key := schema.InstancesPrefix + instance
	var last schema.Registration
	for {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := e.Client.Get(gctx, key)
		cancel()
		if err == nil && len(resp.Kvs) == 1 && json.Unmarshal(resp.Kvs[0].Value, &last) == nil && last.Ready && last.Generation > after {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("localcluster: no ready registration of %s above generation %d (last seen: generation %d, ready %v): %w",
				instance, after, last.Generation, last.Ready, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

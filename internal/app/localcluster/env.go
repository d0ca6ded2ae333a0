package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/etcdauth"
	"github.com/lifeline-llm/lifeline/internal/etcdlog"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Env is the ground a local cluster stands on: a directory, the cluster's
// CA and one certificate directory per component, an embedded etcd that
// requires them with its users and roles set up, an admin client of it,
// and the lifeline binary every child process runs.
type Env struct {
	Dir    string
	Binary string
	// CA is the root CA's directory. Its key never leaves it: only this
	// process reads it (children get their own directories, never this
	// path).
	CA string
	// Certs is a frontend identity ("frontend:client") for tests and
	// tools that dial workers and transfer endpoints as a frontend does.
	Certs string
	// Admin is the admin identity Client uses (etcd's root role).
	Admin string
	// Etcd is the member embedded in this process (nil when the members
	// run as processes of their own: Members); Endpoints are every
	// member's client addresses.
	Etcd      *embedetcd.Server
	Members   []*EtcdMember
	Endpoints []string
	// NodeEndpoints are the members' client addresses on EtcdHosts (nil
	// without them).
	NodeEndpoints []string
	Client        *clientv3.Client

	mu        sync.Mutex
	issued    map[pki.Identity]bool
	frontends int
}

// NewEnv creates the CA under dir (unless ca names an existing one),
// issues etcd's, an admin's and a client frontend's certificates, starts
// an embedded etcd in dir/etcd and turns its auth on.
func NewEnv(dir, binary, ca string) (*Env, error) {
	return NewEnvWith(dir, binary, ca, EnvOptions{})
}

// EnvOptions shape an Env.
type EnvOptions struct {
	// EtcdMembers, when set, runs an etcd cluster of that many members,
	// each a `lifeline etcd` process of its own (their output to
	// EtcdLog), instead of one member embedded in this process.
	EtcdMembers int
	EtcdLog     io.Writer
	// EtcdHosts are more addresses of this machine etcd serves clients on
	// (a bridge's: nodes in network namespaces reach it there); their
	// endpoints are NodeEndpoints.
	EtcdHosts []string
	// EtcdCompaction and EtcdQuotaBytes tune the embedded member (see
	// embedetcd.Member; zero: the defaults).
	EtcdCompaction time.Duration
	EtcdQuotaBytes int64
	// EtcdElection is the member processes' election timeout (see
	// embedetcd.Member; zero: etcd's).
	EtcdElection time.Duration
}

// NewEnvWith is NewEnv shaped by o.
func NewEnvWith(dir, binary, ca string, o EnvOptions) (_ *Env, err error) {
	if binary == "" {
		if binary, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, Binary: binary, CA: ca, issued: map[pki.Identity]bool{}}
	if e.CA == "" {
		e.CA = filepath.Join(dir, "ca")
	}
	if err := pki.Init(e.CA); err != nil {
		return nil, err
	}
	etcdCerts, err := e.issue(pki.Etcd("local"), o.EtcdHosts...)
	if err != nil {
		return nil, err
	}
	if e.Admin, err = e.issue(pki.Admin("local")); err != nil {
		return nil, err
	}
	if o.EtcdMembers > 0 {
		log := o.EtcdLog
		if log == nil {
			log = io.Discard
		}
		if e.Members, err = startMembers(binary, filepath.Join(dir, "etcd"), etcdCerts, o.EtcdMembers, o.EtcdHosts, o.EtcdElection, log); err != nil {
			return nil, err
		}
		for _, m := range e.Members {
			e.Endpoints = append(e.Endpoints, m.Endpoint)
			e.NodeEndpoints = append(e.NodeEndpoints, hostPorts(o.EtcdHosts, m.m.ClientPort)...)
		}
	} else {
		if e.Etcd, err = embedetcd.StartTuned(filepath.Join(dir, "etcd"), 0, o.EtcdHosts, etcdCerts,
			embedetcd.Member{CompactionRetention: o.EtcdCompaction, QuotaBytes: o.EtcdQuotaBytes}); err != nil {
			return nil, err
		}
		e.Endpoints = []string{e.Etcd.Endpoint}
		e.NodeEndpoints = hostPorts(o.EtcdHosts, e.Etcd.Port())
	}
	tlsConf, err := pki.EtcdClientTLS(e.Admin)
	if err == nil {
		logTo := o.EtcdLog
		if logTo == nil {
			logTo = io.Discard
		}
		e.Client, err = clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, TLS: tlsConf,
			Logger: etcdlog.New(slog.New(slog.NewTextHandler(logTo, nil)))})
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = etcdauth.Enable(ctx, e.Client, pki.Admin("local"))
		cancel()
	}
	if err == nil {
		e.Certs, err = e.Identity(pki.Frontend("client"))
	}
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("localcluster: etcd: %w", err)
	}
	return e, nil
}

func hostPorts(hosts []string, port int) []string {
	var out []string
	for _, h := range hosts {
		out = append(out, net.JoinHostPort(h, strconv.Itoa(port)))
	}
	return out
}

// IdentityDir is where id's certificate directory is (or will be).
func (e *Env) IdentityDir(id pki.Identity) string {
	return filepath.Join(e.Dir, "certs", id.DirName())
}

// issue writes id's certificate directory unless it is there, naming
// hosts too (again when the one there does not name them all).
func (e *Env) issue(id pki.Identity, hosts ...string) (string, error) {
	dir := e.IdentityDir(id)
	if _, err := os.Stat(filepath.Join(dir, pki.KeyFile)); err == nil && namesAll(dir, hosts) {
		return dir, nil
	}
	return dir, pki.Issue(e.CA, dir, id, hosts)
}

// namesAll says whether the certificate in dir names every host (IP
// addresses or DNS names).
func namesAll(dir string, hosts []string) bool {
	if len(hosts) == 0 {
		return true
	}
	conf, err := pki.Load(dir, "")
	if err != nil || len(conf.Certificates) == 0 || conf.Certificates[0].Leaf == nil {
		return false
	}
	for _, h := range hosts {
		if conf.Certificates[0].Leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// Identity returns id's certificate directory, issuing it and adding id
// to etcd's users (agents, frontends) the first time.
func (e *Env) Identity(id pki.Identity) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	dir, err := e.issue(id)
	if err != nil || e.issued[id] {
		return dir, err
	}
	if id.Role == pki.RoleAgent || id.Role == pki.RoleFrontend || id.Role == pki.RoleAdmin {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = etcdauth.Add(ctx, e.Client, id)
		cancel()
		if err != nil {
			return dir, err
		}
	}
	e.issued[id] = true
	return dir, nil
}

// Close stops the etcd client and server (or members).
func (e *Env) Close() {
	if e.Client != nil {
		e.Client.Close()
	}
	if e.Etcd != nil {
		e.Etcd.Close()
	}
	stopMembers(e.Members)
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

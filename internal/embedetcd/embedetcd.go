// Package embedetcd runs a single-member etcd inside the process, on free
// loopback ports: what `lifeline up` uses on one machine and what tests use
// as a real etcd.
package embedetcd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is a running embedded etcd.
type Server struct {
	etcd     *embed.Etcd
	Endpoint string
	dir      string
	port     int
	once     sync.Once
	certDir  string
	peer     string
}

// CertDir is the certificate directory it requires client certificates
// from, or "" for plain connections.
func (s *Server) CertDir() string { return s.certDir }

// Dir and Port let a caller start the same member again after Close.
func (s *Server) Dir() string { return s.dir }
func (s *Server) Port() int   { return s.port }

// FreePort is a loopback TCP port free now.
func FreePort() (int, error) { return freePort() }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start runs etcd with its data in dir and waits until it serves. If
// clientPort is 0 a free one is picked. With certDir (an etcd identity's
// directory, `lifeline certs issue --role etcd`) both ports are mutual
// TLS: clients must present a certificate of the cluster CA (etcd maps
// its common name to a user once auth is on: internal/etcdauth), and the
// peer port accepts only etcd members' certificates. Without it
// (in-process tests only) both are plain HTTP.
func Start(dir string, clientPort int, certDir ...string) (*Server, error) {
	cd := ""
	if len(certDir) > 0 {
		cd = certDir[0]
	}
	return StartOn(dir, clientPort, nil, cd)
}

// StartOn is Start serving clients on hosts (IP addresses of this
// machine, on the same port) besides loopback: processes in other network
// namespaces reach it there.
func StartOn(dir string, clientPort int, hosts []string, certDir string) (*Server, error) {
	return StartTuned(dir, clientPort, hosts, certDir, Member{})
}

// StartTuned is StartOn with tune's CompactionRetention and QuotaBytes.
func StartTuned(dir string, clientPort int, hosts []string, certDir string, tune Member) (*Server, error) {
	// A port found free can be taken by another process before etcd binds
	// it; when the ports were ours to pick, pick again.
	for attempt := 0; ; attempt++ {
		s, err := start(dir, clientPort, hosts, certDir, tune)
		if err == nil || attempt == 4 || !errors.Is(err, syscall.EADDRINUSE) {
			return s, err
		}
	}
}

func start(dir string, clientPort int, hosts []string, certDir string, tune Member) (*Server, error) {
	var err error
	if clientPort == 0 {
		if clientPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	return StartMember(Member{Dir: dir, ClientPort: clientPort, PeerPort: peerPort, CertDir: certDir, ClientHosts: hosts,
		CompactionRetention: tune.CompactionRetention, QuotaBytes: tune.QuotaBytes})
}

// Member is one member of an etcd cluster.
type Member struct {
	// Name is the member's name (default "default"), Dir its data.
	Name, Dir string
	// ClientPort and PeerPort are its loopback ports.
	ClientPort, PeerPort int
	// ClientHosts are more addresses clients reach it at, on ClientPort
	// (a bridge's, for nodes in network namespaces of their own).
	ClientHosts []string
	// PeerHost, when set, is the address its peer port serves and is
	// advertised at instead of loopback, for members on other machines;
	// it needs CertDir (the peer port then takes etcd certificates only).
	PeerHost string
	// InitialCluster is "name=peerURL,…" of every member at bootstrap
	// (default: this member alone). A member that has data ignores it.
	InitialCluster string
	// CertDir is an etcd identity's directory: both ports mutual TLS.
	CertDir string
	// Join: the member was added to a running cluster (member add) and
	// starts without data; InitialCluster then names the cluster's
	// members, this one included.
	Join bool
	// CompactionRetention is how much history the member keeps: every
	// period as long, revisions older than it are compacted away
	// (default DefaultCompactionRetention). Without compaction every
	// write ever made stays, until the quota's no-space alarm stops all
	// writes of the cluster.
	CompactionRetention time.Duration
	// QuotaBytes is the backend's size at which etcd raises its
	// no-space alarm (default etcd's, 2 GiB).
	QuotaBytes int64
	// MetricsAddr, when set, is a loopback host:port for etcd's own
	// /metrics (etcd_mvcc_db_total_size_in_bytes, …).
	MetricsAddr string
	// ElectionTimeout is how long a follower waits for its leader's
	// heartbeat before it starts an election (default etcd's, 1 s; the
	// heartbeat is a tenth of it). Longer across slow links.
	ElectionTimeout time.Duration
}

// DefaultCompactionRetention is a member's history by default.
const DefaultCompactionRetention = time.Minute

// Scheme is "https" when the member serves TLS.
func (m Member) Scheme() string {
	if m.CertDir != "" {
		return "https"
	}
	return "http"
}

// PeerURL is the member's peer URL.
func (m Member) PeerURL() string {
	host := "127.0.0.1"
	if m.PeerHost != "" {
		host = m.PeerHost
	}
	return fmt.Sprintf("%s://%s", m.Scheme(), net.JoinHostPort(host, strconv.Itoa(m.PeerPort)))
}

// memberNames are the names of "name=peerURL,…".
func memberNames(initial string) []string {
	var names []string
	for _, m := range strings.Split(initial, ",") {
		if name, _, ok := strings.Cut(m, "="); ok && name != "" {
			names = append(names, name)
		}
	}
	return names
}

// StartMember runs member m and waits until it serves (for a member of
// several, until the cluster has a quorum).
func StartMember(m Member) (*Server, error) {
	if m.PeerHost != "" && m.CertDir == "" {
		return nil, fmt.Errorf("embedetcd: a peer port off loopback (%s) needs mutual TLS: give the member an etcd identity's certificates", m.PeerHost)
	}
	cfg := embed.NewConfig()
	cfg.Dir = m.Dir
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal"
	if m.Name != "" {
		cfg.Name = m.Name
	}
	if m.CertDir != "" {
		if err := lockDown(cfg, m.CertDir, memberNames(m.InitialCluster)); err != nil {
			return nil, err
		}
	}
	cu, _ := url.Parse(fmt.Sprintf("%s://127.0.0.1:%d", m.Scheme(), m.ClientPort))
	pu, _ := url.Parse(m.PeerURL())
	cus := []url.URL{*cu}
	for _, h := range m.ClientHosts {
		u, err := url.Parse(fmt.Sprintf("%s://%s", m.Scheme(), net.JoinHostPort(h, fmt.Sprint(m.ClientPort))))
		if err != nil {
			return nil, fmt.Errorf("embedetcd: client host %q: %w", h, err)
		}
		cus = append(cus, *u)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = cus, cus
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	retention := m.CompactionRetention
	if retention <= 0 {
		retention = DefaultCompactionRetention
	}
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", retention.String()
	if m.QuotaBytes > 0 {
		cfg.QuotaBackendBytes = m.QuotaBytes
	}
	if m.ElectionTimeout > 0 {
		cfg.ElectionMs = uint(m.ElectionTimeout.Milliseconds())
		cfg.TickMs = max(cfg.ElectionMs/10, 1)
	}
	if m.MetricsAddr != "" {
		mu, err := url.Parse("http://" + m.MetricsAddr)
		if err != nil {
			return nil, fmt.Errorf("embedetcd: metrics address %q: %w", m.MetricsAddr, err)
		}
		cfg.ListenMetricsUrls = []url.URL{*mu}
	}
	cfg.InitialCluster = m.InitialCluster
	if m.Join {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, pu.String())
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedetcd: not ready after 30s")
	}
	s := &Server{etcd: e, Endpoint: cu.Host, dir: m.Dir, port: m.ClientPort, peer: pu.String(), certDir: m.CertDir}
	return s, nil
}

// Close stops etcd; a second Close does nothing.
func (s *Server) Close() {
	s.once.Do(func() {
		s.etcd.Close()
		<-s.etcd.Server.StopNotify()
	})
}

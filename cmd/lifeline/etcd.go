package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/internal/embedetcd"
)

// etcdCmd runs one etcd member as a process of its own (`lifeline up
// --etcd-members N` starts N of them).
func etcdCmd() *cobra.Command {
	var m embedetcd.Member
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run one etcd member (of a cluster of loopback members) until SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if m.Dir == "" || m.ClientPort <= 0 || m.PeerPort <= 0 {
				return fmt.Errorf("etcd: --data-dir, --client-port and --peer-port are required")
			}
			s, err := embedetcd.StartMember(m)
			if err != nil {
				return err
			}
			defer s.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "etcd: member %s serving on %s\n", m.Name, s.Endpoint)
			<-cmd.Context().Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&m.Name, "name", "default", "member name")
	f.StringVar(&m.Dir, "data-dir", "", "the member's data directory")
	f.IntVar(&m.ClientPort, "client-port", 0, "client port (on loopback, and on each --client-host)")
	f.IntVar(&m.PeerPort, "peer-port", 0, "peer port (on loopback, or on --peer-host)")
	f.StringVar(&m.PeerHost, "peer-host", "", "this machine's address for the other members (peer port there instead of loopback; needs --certs)")
	f.StringVar(&m.InitialCluster, "initial-cluster", "", "name=peer-URL,… of every member at bootstrap (default: this one alone)")
	f.StringSliceVar(&m.ClientHosts, "client-host", nil, "another address of this machine to serve clients on, at --client-port (repeatable)")
	f.StringVar(&m.CertDir, "certs", "", "an etcd identity's certificate directory (lifeline certs issue --role etcd): both ports mutual TLS")
	f.BoolVar(&m.Join, "join", false, "join a running cluster this member was added to (etcd member add), without data")
	f.DurationVar(&m.CompactionRetention, "compaction-retention", embedetcd.DefaultCompactionRetention, "history kept: revisions older than this are compacted away, every period as long")
	f.Int64Var(&m.QuotaBytes, "quota-bytes", 0, "backend size at which etcd raises its no-space alarm (default etcd's, 2 GiB)")
	f.DurationVar(&m.ElectionTimeout, "election-timeout", 0, "how long a follower waits for the leader's heartbeat before an election (default etcd's, 1s; heartbeats every tenth of it)")
	f.StringVar(&m.MetricsAddr, "metrics-addr", "", "a loopback host:port for etcd's own /metrics (etcd_mvcc_db_total_size_in_bytes, …)")
	return cmd
}

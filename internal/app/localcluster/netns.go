package localcluster

import (
	"fmt"
	"net"
	"os/exec"

	"github.com/lifeline-llm/lifeline/internal/netns"
)

// InNamespace makes n run in network namespace ns (call before Start):
// its workers' endpoints, its transfer endpoint and its metrics listen on
// the namespace's address, it reaches etcd at the bridge (NodeEndpoints:
// the Env needs EtcdHosts), and its agent is started there through
// `lifeline netns-exec`; its workers inherit the namespace.
func (e *Env) InNamespace(n *Node, ns *netns.Node) error {
	if len(e.NodeEndpoints) == 0 {
		return fmt.Errorf("localcluster: node %s in namespace %s: etcd serves no address outside loopback (EnvOptions.EtcdHosts)", n.Options.NodeID, ns.Name)
	}
	ip := ns.IP.String()
	o := &n.Options
	o.Etcd = append([]string(nil), e.NodeEndpoints...)
	o.BindAddress = ip
	o.TransferListen = net.JoinHostPort(ip, "0")
	if o.Metrics != "" {
		_, port, err := net.SplitHostPort(o.Metrics)
		if err != nil {
			return fmt.Errorf("localcluster: metrics address %q: %w", o.Metrics, err)
		}
		o.Metrics = net.JoinHostPort(ip, port)
	}
	inner := n.Wrap
	n.Wrap = func(cmd *exec.Cmd) *exec.Cmd {
		if inner != nil {
			cmd = inner(cmd)
		}
		argv := append([]string{cmd.Path}, cmd.Args[1:]...)
		w := ns.Wrap(e.Binary, argv)
		c := exec.Command(w[0], w[1:]...)
		c.Env, c.Dir, c.SysProcAttr = cmd.Env, cmd.Dir, cmd.SysProcAttr
		return c
	}
	n.Namespace = ns
	return nil
}

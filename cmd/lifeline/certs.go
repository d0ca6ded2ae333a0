package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/internal/etcdauth"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

func certsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "certs", Short: "The cluster CA, a certificate per component and role, and etcd's users and roles"}
	var dir string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create the cluster CA in --dir (mode 0700, key 0600; kept if present). Keep this directory off the cluster's machines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, statErr := os.Stat(filepath.Join(dir, pki.CAKey))
			if err := pki.Init(dir); err != nil {
				return err
			}
			what := "created"
			if statErr == nil {
				what = "kept (it was there)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster CA %s: %s (certificate), %s (key, 0600)\nnext: lifeline certs issue --ca %s --role ROLE --name NAME\n",
				what, filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CAKey), dir)
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "", "CA directory")
	initCmd.MarkFlagRequired("dir")
	cmd.AddCommand(initCmd, issueCmd(), etcdSetupCmd())
	return cmd
}

func issueCmd() *cobra.Command {
	var (
		ca, out, role, name string
		hosts               []string
	)
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue one component's certificate (CN <role>:<name>) into its own directory: ca.pem, cert.pem, key.pem (0600); an agent's also gets its node CA, which signs its workers' certificates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id := pki.Identity{Role: pki.Role(role), Name: name}
			if err := id.Validate(); err != nil {
				return err
			}
			if out == "" {
				out = filepath.Join(filepath.Dir(filepath.Clean(ca)), id.DirName())
			}
			if err := pki.Issue(ca, out, id, hosts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", id, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&ca, "ca", "", "CA directory (lifeline certs init)")
	f.StringVar(&out, "dir", "", "the component's directory (default: <role>-<name> next to the CA directory)")
	f.StringVar(&role, "role", "", "agent, frontend, worker, etcd or admin")
	f.StringVar(&name, "name", "", "the agent's node id; the frontend's id; <node>/<instance> for a worker; any name for etcd and admin")
	f.StringSliceVar(&hosts, "host", nil, "extra DNS names or IPs the certificate serves (localhost and loopback are always in)")
	cmd.MarkFlagRequired("ca")
	cmd.MarkFlagRequired("role")
	cmd.MarkFlagRequired("name")
	return cmd
}

func etcdSetupCmd() *cobra.Command {
	var (
		endpoints, nodes, frontends, admins []string
		certs, ca                           string
	)
	cmd := &cobra.Command{
		Use:   "etcd-setup",
		Short: "Create etcd users and roles for the cluster's agents and frontends and turn etcd's auth on (idempotent; run with an admin certificate)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(endpoints) == 0 {
				return fmt.Errorf("--etcd: required")
			}
			admin, err := pki.DirIdentity(certs)
			if err != nil {
				return err
			}
			tlsConf, err := pki.EtcdClientTLS(certs)
			if err != nil {
				return err
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: tlsConf})
			if err != nil {
				return fmt.Errorf("etcd: %w", err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			// A new admin identity is no etcd user while auth is on: etcd
			// knows none by that name. With the CA (whose holder may
			// issue any identity) it adds itself as etcd's root user.
			if _, err := cli.RoleGet(ctx, "root"); errors.Is(err, rpctypes.ErrUserNotFound) || errors.Is(err, rpctypes.ErrAuthFailed) {
				if ca == "" {
					return fmt.Errorf("etcd-setup: %s is not an etcd user yet and etcd's auth is on: add it with an admin etcd knows (lifeline certs etcd-setup --etcd %s --certs THAT-ADMIN'S-DIR --admin %s), or give the cluster's CA to add it (--ca CA-DIR)",
						admin, strings.Join(endpoints, ","), admin.Name)
				}
				if err := addAdminAsRoot(ctx, endpoints, ca, admin); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s added as an etcd user with the CA (as etcd's root user)\n", admin)
			}
			var ids []pki.Identity
			for _, n := range nodes {
				ids = append(ids, pki.Agent(n))
			}
			for _, n := range frontends {
				ids = append(ids, pki.Frontend(n))
			}
			for _, n := range admins {
				ids = append(ids, pki.Admin(n))
			}
			if err := etcdauth.Setup(ctx, cli, admin, ids...); err != nil {
				return err
			}
			names := make([]string, len(ids))
			for i, id := range ids {
				names[i] = id.String()
			}
			fmt.Fprintf(cmd.OutOrStdout(), "etcd auth on (admin %s); users: %s\n", admin, strings.Join(names, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&endpoints, "etcd", nil, "etcd endpoints host:port,...")
	f.StringVar(&certs, "certs", "", "an admin's certificate directory (lifeline certs issue --role admin)")
	f.StringSliceVar(&nodes, "node", nil, "node ids whose agents get users (each writes only its node's keys)")
	f.StringSliceVar(&frontends, "frontend", nil, "frontend ids that get users")
	f.StringSliceVar(&admins, "admin", nil, "further admin names (etcd root)")
	f.StringVar(&ca, "ca", "", "the cluster's CA directory: makes --certs an etcd user first when etcd's auth is on and knows no user by its name")
	cmd.MarkFlagRequired("certs")
	return cmd
}

// addAdminAsRoot makes admin an etcd user with etcd's root role, acting
// as etcd's root user with a short-lived certificate from the CA in ca.
func addAdminAsRoot(ctx context.Context, endpoints []string, ca string, admin pki.Identity) error {
	conf, err := pki.EtcdRootTLS(ca, 5*time.Minute)
	if err != nil {
		return fmt.Errorf("etcd-setup: --ca: %w", err)
	}
	// etcd refuses a certificate from another CA in the TLS handshake,
	// which gRPC would retry until the command's deadline (30 s).
	for _, ep := range endpoints {
		if err := pki.CertRefused(strings.TrimPrefix(ep, "https://"), conf, 3*time.Second); err != nil {
			return fmt.Errorf("etcd-setup: etcd at %s refused a root certificate from --ca %s (%v): --ca must be the CA that issued etcd's certificates", ep, ca, err)
		}
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: conf})
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer root.Close()
	if err := etcdauth.Add(ctx, root, admin); err != nil {
		return fmt.Errorf("etcd-setup: adding %s as etcd's root user: %w (is --ca the CA that issued etcd's certificates?)", admin, err)
	}
	return nil
}

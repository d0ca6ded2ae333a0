// Package etcdauth puts the cluster's identities into etcd's access
// control: one etcd user per certificate (etcd takes a client
// certificate's common name as the user name once auth is on), each with
// roles that grant exactly the keys of agent/schema its component writes
// and reads. An agent writes only its node's keys; a frontend only request
// records, the resume key ring and its own record; only admins (etcd's
// root role) do anything else, and nobody but the owning agent deletes a
// registration.
package etcdauth

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// frontendRole holds what every frontend may do.
const frontendRole = "lifeline-frontend"

// grant is one permission of a role: a key, or every key under it.
type grant struct {
	key    string
	prefix bool
	perm   clientv3.PermissionType
}

var (
	read      = clientv3.PermissionType(clientv3.PermRead)
	readWrite = clientv3.PermissionType(clientv3.PermReadWrite)
)

// agentGrants are the keys node's agent may touch: read the
// registrations (drain acknowledgements compare them), the frontends'
// records, the other nodes' records (it dials their transfer endpoints
// ahead of need) and the disruption budget; write its node record, its
// disruption-budget share, and its instances' registrations,
// generations and failure announcements. Instance ids are
// "<node>-<role>-<preset>-<k>", and pki.ValidNode keeps a node's
// "<node>-<role>-" prefixes disjoint from every other node's.
func agentGrants(node string) []grant {
	g := []grant{
		{schema.InstancesPrefix, true, read},
		{schema.FrontendsPrefix, true, read},
		{schema.NodesPrefix, true, read},
		{"/lifeline/v1/drain/", true, read},
		{schema.NodesPrefix + node, false, readWrite},
		{schema.DrainHoldersPrefix + node, false, readWrite},
	}
	for _, role := range []string{"decode", "prefill", "both"} {
		for _, p := range []string{schema.InstancesPrefix, schema.GenerationsPrefix, schema.FailuresPrefix} {
			g = append(g, grant{p + node + "-" + role + "-", true, readWrite})
		}
	}
	return g
}

// frontendGrants are the keys every frontend may touch: read the
// registrations, failure announcements and node records it routes by,
// and the frontends' keys (whether a request's owner lives; whose
// background responses are orphaned);
// write request records (a takeover rewrites another frontend's) and the
// resume key ring (the first frontend creates it if missing; a frontend
// holds the ring's secrets anyway, so writing it adds no power to mint
// tokens).
func frontendGrants() []grant {
	return []grant{
		{schema.InstancesPrefix, true, read},
		{schema.FailuresPrefix, true, read},
		{schema.NodesPrefix, true, read},
		{schema.FrontendsPrefix, true, read},
		{schema.RequestsPrefix, true, readWrite},
		{schema.ResumeKeysKey, false, readWrite},
	}
}

// ownFrontendGrants: a frontend writes its own record only.
func ownFrontendGrants(name string) []grant {
	return []grant{{schema.FrontendsPrefix + name, false, readWrite}}
}

func ignoreExists(err error) error {
	if errors.Is(err, rpctypes.ErrUserAlreadyExist) || errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return nil
	}
	return err
}

// role creates role (if missing) with grants.
func role(ctx context.Context, cli *clientv3.Client, name string, grants []grant) error {
	if _, err := cli.RoleAdd(ctx, name); ignoreExists(err) != nil {
		return fmt.Errorf("etcdauth: role %s: %w", name, err)
	}
	for _, g := range grants {
		end := ""
		if g.prefix {
			end = clientv3.GetPrefixRangeEnd(g.key)
		}
		if _, err := cli.RoleGrantPermission(ctx, name, g.key, end, g.perm); err != nil {
			return fmt.Errorf("etcdauth: role %s: grant %s: %w", name, g.key, err)
		}
	}
	return nil
}

// user creates a user without a password (it authenticates by its
// certificate only) with roles.
func user(ctx context.Context, cli *clientv3.Client, name string, roles ...string) error {
	if _, err := cli.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true}); ignoreExists(err) != nil {
		return fmt.Errorf("etcdauth: user %s: %w", name, err)
	}
	for _, r := range roles {
		if _, err := cli.UserGrantRole(ctx, name, r); err != nil {
			return fmt.Errorf("etcdauth: user %s: role %s: %w", name, r, err)
		}
	}
	return nil
}

// Add makes id an etcd user with its role's grants: agents and frontends
// their keys, admins etcd's root role. Workers and etcd members are no
// clients of etcd.
func Add(ctx context.Context, cli *clientv3.Client, id pki.Identity) error {
	if err := id.Validate(); err != nil {
		return err
	}
	switch id.Role {
	case pki.RoleAgent:
		if err := role(ctx, cli, id.String(), agentGrants(id.Name)); err != nil {
			return err
		}
		return user(ctx, cli, id.String(), id.String())
	case pki.RoleFrontend:
		if err := role(ctx, cli, frontendRole, frontendGrants()); err != nil {
			return err
		}
		if err := role(ctx, cli, id.String(), ownFrontendGrants(id.Name)); err != nil {
			return err
		}
		return user(ctx, cli, id.String(), frontendRole, id.String())
	case pki.RoleAdmin:
		return user(ctx, cli, id.String(), "root")
	}
	return fmt.Errorf("etcdauth: %s: a %s is no etcd client", id, id.Role)
}

// Enable turns etcd's auth on with admin as a root user: etcd requires a
// user named root first (one without a password, so nobody logs in as
// it). Calling it again changes nothing.
func Enable(ctx context.Context, cli *clientv3.Client, admin pki.Identity) error {
	if admin.Role != pki.RoleAdmin {
		return fmt.Errorf("etcdauth: %s is not an admin identity", admin)
	}
	if _, err := cli.RoleAdd(ctx, "root"); ignoreExists(err) != nil {
		return fmt.Errorf("etcdauth: role root: %w", err)
	}
	if err := user(ctx, cli, "root", "root"); err != nil {
		return err
	}
	if err := Add(ctx, cli, admin); err != nil {
		return err
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcdauth: enable: %w", err)
	}
	return nil
}

// Setup enables auth with admin and adds ids: what `lifeline certs
// etcd-setup` applies to an existing cluster, and `lifeline up` to its
// embedded one.
func Setup(ctx context.Context, cli *clientv3.Client, admin pki.Identity, ids ...pki.Identity) error {
	if err := Enable(ctx, cli, admin); err != nil {
		return err
	}
	for _, id := range ids {
		if err := Add(ctx, cli, id); err != nil {
			return err
		}
	}
	return nil
}

package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Role is what a component is to its peers; every certificate names one.
type Role string

// The cluster's roles.
const (
	RoleAgent    Role = "agent"
	RoleFrontend Role = "frontend"
	RoleWorker   Role = "worker"
	RoleEtcd     Role = "etcd"
	RoleAdmin    Role = "admin"
)

// nodeCARole is the common-name prefix of a node's intermediate CA: it
// signs only worker certificates of its own node.
const nodeCARole = "nodeca"

// Roles lists the roles `certs issue` accepts.
var Roles = []Role{RoleAgent, RoleFrontend, RoleWorker, RoleEtcd, RoleAdmin}

// ErrIdentity is wrapped by every refusal of a malformed identity.
var ErrIdentity = errors.New("pki: bad identity")

// Identity names a component: CN "<role>:<name>" and the URI SAN
// "lifeline://<role>/<name>". A worker's name is "<node>/<instance>";
// every other role's name is a single label (an agent's is its node id).
type Identity struct {
	Role Role
	Name string
}

// Agent is node's agent identity.
func Agent(node string) Identity { return Identity{RoleAgent, node} }

// Frontend is a frontend's identity.
func Frontend(name string) Identity { return Identity{RoleFrontend, name} }

// Worker is the identity of a worker of instance on node.
func Worker(node, instance string) Identity { return Identity{RoleWorker, node + "/" + instance} }

// Etcd is an etcd member's identity.
func Etcd(name string) Identity { return Identity{RoleEtcd, name} }

// Admin is an operator's identity (etcd's root role).
func Admin(name string) Identity { return Identity{RoleAdmin, name} }

// String is the identity's common name.
func (id Identity) String() string { return string(id.Role) + ":" + id.Name }

func (id Identity) uri() *url.URL {
	return &url.URL{Scheme: "lifeline", Host: string(id.Role), Path: "/" + id.Name}
}

// DirName is a directory name for the identity's files.
func (id Identity) DirName() string {
	return string(id.Role) + "-" + strings.ReplaceAll(id.Name, "/", "_")
}

func nodeCAName(node string) string { return nodeCARole + ":" + node }

func validRole(r Role) bool {
	return r == RoleAgent || r == RoleFrontend || r == RoleWorker || r == RoleEtcd || r == RoleAdmin
}

func identityErr(f string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrIdentity, fmt.Sprintf(f, a...))
}

// Node is the node an agent or worker identity belongs to ("" for the
// other roles).
func (id Identity) Node() string {
	switch id.Role {
	case RoleAgent:
		return id.Name
	case RoleWorker:
		node, _, _ := strings.Cut(id.Name, "/")
		return node
	}
	return ""
}

// Instance is a worker identity's instance id ("" for the other roles).
func (id Identity) Instance() string {
	if id.Role != RoleWorker {
		return ""
	}
	_, inst, _ := strings.Cut(id.Name, "/")
	return inst
}

var label = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// instanceRoles are the roles an agent names its instances by:
// "<node>-<role>-<preset>-<k>".
var instanceRoles = []string{"decode", "prefill", "both"}

// ValidNode refuses a node id that is not a label, or that would make the
// node-scoped key prefixes "<node>-<role>-" ambiguous: no node id may
// contain "-decode-", "-prefill-" or "-both-", nor end in "-decode",
// "-prefill" or "-both", so "<a>-decode-" is never a prefix of another
// node's "<b>-decode-…" keys.
func ValidNode(node string) error {
	if !label.MatchString(node) {
		return identityErr("node %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", node)
	}
	for _, r := range instanceRoles {
		if strings.Contains(node+"-", "-"+r+"-") {
			return identityErr("node %q: contains -%s: its instance key prefixes would overlap another node's", node, r)
		}
	}
	return nil
}

// InstanceNode is the node an agent-made instance id ("<node>-<role>-…")
// belongs to, or false for an id of another form.
func InstanceNode(instance string) (string, bool) {
	best := -1
	for _, r := range instanceRoles {
		if i := strings.Index(instance, "-"+r+"-"); i > 0 && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	return instance[:best], true
}

// Validate checks the identity's role and name.
func (id Identity) Validate() error {
	if !validRole(id.Role) {
		return identityErr("role %q: want agent, frontend, worker, etcd or admin", id.Role)
	}
	if id.Role == RoleAgent {
		return ValidNode(id.Name)
	}
	if id.Role != RoleWorker {
		if !label.MatchString(id.Name) {
			return identityErr("%s name %q: want 1-63 letters, digits, '.', '_' or '-'", id.Role, id.Name)
		}
		return nil
	}
	node, inst, ok := strings.Cut(id.Name, "/")
	if !ok {
		return identityErr("worker name %q: want <node>/<instance>", id.Name)
	}
	if err := ValidNode(node); err != nil {
		return err
	}
	if !label.MatchString(inst) {
		return identityErr("worker instance %q: want 1-63 letters, digits, '.', '_' or '-'", inst)
	}
	// An agent-made instance id names its node: a node's CA cannot
	// name another node's instances.
	if n, ok := InstanceNode(inst); ok && n != node {
		return identityErr("worker %q: the instance belongs to node %q, not %q", id.Name, n, node)
	}
	return nil
}

// ParseIdentity parses a common name "<role>:<name>".
func ParseIdentity(cn string) (Identity, error) {
	role, name, ok := strings.Cut(cn, ":")
	if !ok {
		return Identity{}, identityErr("common name %q: want <role>:<name>", cn)
	}
	id := Identity{Role: Role(role), Name: name}
	return id, id.Validate()
}

// CertIdentity is the identity a certificate names: its common name,
// which its URI SAN must repeat.
func CertIdentity(c *x509.Certificate) (Identity, error) {
	id, err := ParseIdentity(c.Subject.CommonName)
	if err != nil {
		return id, err
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != id.uri().String() {
		return id, identityErr("certificate %q: its URI SAN %v does not name it", c.Subject.CommonName, c.URIs)
	}
	return id, nil
}

// ChainIdentity is the identity a verified chain (leaf first, root last)
// proves. A worker certificate must be signed by the CA of the node it
// names, itself signed by the root; any other certificate by the root
// directly. So a node's CA (held by its agent) can name only its own
// node's workers, and nothing else.
func ChainIdentity(chain []*x509.Certificate) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, identityErr("no certificate")
	}
	id, err := CertIdentity(chain[0])
	if err != nil {
		return id, err
	}
	if id.Role != RoleWorker {
		if len(chain) != 2 {
			return id, identityErr("%s: a %s certificate must be signed by the cluster CA itself", id, id.Role)
		}
		return id, nil
	}
	if len(chain) != 3 || chain[1].Subject.CommonName != nodeCAName(id.Node()) {
		signer := "the cluster CA"
		if len(chain) > 2 {
			signer = chain[1].Subject.CommonName
		}
		return id, identityErr("%s: signed by %s, want %s", id, signer, nodeCAName(id.Node()))
	}
	return id, nil
}

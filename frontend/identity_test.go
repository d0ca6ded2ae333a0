package frontend

import (
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/pkitest"
)

// TestFrontendIDFromCertificate: with etcd over mutual TLS a frontend's
// id is its certificate's name (etcd lets it write that record only);
// another --id, or another role's certificate, is refused at start.
func TestFrontendIDFromCertificate(t *testing.T) {
	certs := pkitest.New(t)
	fe, err := pki.Load(certs.Dir(t, pki.Frontend("fe-7")), "x")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.Load(certs.Dir(t, pki.Agent("n1")), "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{EtcdTLS: true}, "fe-7"},
		{Options{EtcdTLS: true, ID: "fe-7"}, "fe-7"},
		{Options{ID: "other"}, "other"},
	} {
		if got, err := frontendID(tc.opts, fe); err != nil || got != tc.want {
			t.Errorf("%+v: %q, %v; want %q", tc.opts, got, err, tc.want)
		}
	}
	if got, err := frontendID(Options{}, fe); err != nil || got == "" || got == "fe-7" {
		t.Errorf("plain etcd, no id: %q, %v (want the host-pid default)", got, err)
	}
	if _, err := frontendID(Options{EtcdTLS: true, ID: "fe-8"}, fe); err == nil || !strings.Contains(err.Error(), `--id "fe-8", but the certificate is frontend:fe-7`) {
		t.Errorf("another id: %v", err)
	}
	if _, err := frontendID(Options{EtcdTLS: true}, agent); err == nil || !strings.Contains(err.Error(), "agent:n1, not a frontend's") {
		t.Errorf("an agent's certificate: %v", err)
	}
}

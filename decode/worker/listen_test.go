package worker

import (
	"strings"
	"testing"
)

// TestListenNamesOneAddress: a worker binds the one interface it is told,
// and refuses a name or the wildcard by field, before loading anything.
func TestListenNamesOneAddress(t *testing.T) {
	t.Parallel()
	base := Options{InstanceID: "w", Generation: 1, Role: "decode", CertDir: "/certs"}
	for _, listen := range []string{"0.0.0.0:0", "[::]:7000", ":0", "localhost:0", "127.0.0.1"} {
		o := base
		o.Listen = listen
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "worker: listen:") {
			t.Errorf("listen %q: %v, want a listen error", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:0", "[::1]:7000", "10.0.0.1:9000"} {
		o := base
		o.Listen = listen
		if err := o.Validate(); err != nil && strings.Contains(err.Error(), "listen") {
			t.Errorf("listen %q refused: %v", listen, err)
		}
	}
}

package quicdial

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// listen serves QUIC on 127.0.0.1 with fresh cluster certificates and
// returns the listener and a client configuration of the same cluster.
func listen(t *testing.T) (*quic.Listener, *tls.Config) {
	t.Helper()
	dir, err := pki.InitIdentity(filepath.Join(t.TempDir(), "certs"), pki.Frontend("quicdial-test"))
	if err != nil {
		t.Fatal(err)
	}
	tlsConf, err := pki.Load(dir, "quicdial-test")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, tlsConf
}

func dial(t *testing.T, local net.IP, ln *quic.Listener, tlsConf *tls.Config) *quic.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, err := Dial(ctx, local, ln.Addr().String(), tlsConf, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestDialBindsTheRoutedAddress: with no local address, a dial to a
// loopback peer leaves from loopback, not from every interface, and the
// server sees that address.
func TestDialBindsTheRoutedAddress(t *testing.T) {
	ln, tlsConf := listen(t)
	conn := dial(t, nil, ln, tlsConf)
	defer conn.CloseWithError(0, "")
	local := conn.LocalAddr().(*net.UDPAddr)
	if !local.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("client socket bound to %v, want 127.0.0.1", local)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	sc, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := sc.RemoteAddr().String(); got != local.String() {
		t.Fatalf("server sees %s, client bound %s", got, local)
	}
}

// TestDialBindsTheGivenAddress: an explicit local address is the one the
// socket is bound to; closing the connection frees the socket.
func TestDialBindsTheGivenAddress(t *testing.T) {
	ln, tlsConf := listen(t)
	conn := dial(t, net.IPv4(127, 0, 0, 2), ln, tlsConf)
	local := conn.LocalAddr().(*net.UDPAddr)
	if !local.IP.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Fatalf("client socket bound to %v, want 127.0.0.2", local)
	}
	conn.CloseWithError(0, "")
	proctest.WaitFor(t, 5*time.Second, "the closed connection's socket to be released", func() (bool, string) {
		pc, err := net.ListenUDP("udp", local)
		if err != nil {
			return false, err.Error()
		}
		pc.Close()
		return true, ""
	})
}

// TestDialRefusesAnUnknownHost: a peer that does not resolve is an error,
// never a socket bound anyway.
func TestDialRefusesAnUnknownHost(t *testing.T) {
	_, tlsConf := listen(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, nil, "no-such-host.invalid:1", tlsConf, nil); err == nil {
		t.Fatal("dial to an unresolvable host succeeded")
	}
}

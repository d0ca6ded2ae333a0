package client

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// TestRetiredSocketLetsItsTransportClose: a socket a connection moved
// away from still belongs to a quic.Transport until the connection ends;
// closing that transport sets a read deadline to stop its read loop,
// which then waits for the loop. The retired socket hides its peer's
// errors, but not the deadline: Close returns, and nothing is left
// reading (a retired socket that swallowed the deadline error read in a
// loop on one core forever and Close never returned).
func TestRetiredSocketLetsItsTransportClose(t *testing.T) {
	peer, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	sock, err := dialSocket(peer.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	tr := &quic.Transport{Conn: sock}
	// A listener makes the transport read from the socket (its Close
	// closes the listener too).
	if _, err := tr.Listen(&tls.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	// The peer goes away: its port answers with ICMP port unreachable,
	// which the retired socket must not report.
	peer.Close()
	sock.retire()
	if _, err := sock.WriteTo([]byte("x"), peer.LocalAddr()); err != nil {
		t.Fatalf("a retired socket's write: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- tr.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the transport of a retired socket did not close within 5 s: its read loop never saw the deadline")
	}
}

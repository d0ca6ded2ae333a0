package frontend

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestListenAPIMovesOffATakenUDPPort: with TLS on port 0, the free TCP
// port the kernel picks may have its UDP side taken by another socket on
// the host (any QUIC endpoint). The frontend once exited then ("HTTP/3 on
// UDP N: address already in use", a CI failure); it now closes that TCP
// listener and picks another port. A port asked for by number is not
// moved: the error names it.
func TestListenAPIMovesOffATakenUDPPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := taken.Addr().(*net.TCPAddr).Port
	blocker, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	calls := 0
	listen := func(network, addr string) (net.Listener, error) {
		if calls++; calls == 1 {
			return taken, nil
		}
		return net.Listen(network, addr)
	}
	ln, udp, err := listenAPI("127.0.0.1:0", true, listen)
	if err != nil {
		t.Fatalf("listen with the first port's UDP side taken: %v", err)
	}
	defer ln.Close()
	defer udp.Close()
	got := ln.Addr().(*net.TCPAddr).Port
	if got == port || udp.LocalAddr().(*net.UDPAddr).Port != got || calls != 2 {
		t.Fatalf("TCP port %d, UDP %v, %d listens: want one new port for both (the taken one was %d)", got, udp.LocalAddr(), calls, port)
	}
	if _, err := taken.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the first TCP listener was left open: %v", err)
	}

	fixed := blocker.LocalAddr().String()
	if _, _, err := listenAPI(fixed, true, net.Listen); !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "HTTP/3 on UDP "+strconv.Itoa(port)) {
		t.Fatalf("listen on %s with its UDP side taken: %v, want the HTTP/3 port in use", fixed, err)
	}
	plain, udp, err := listenAPI("127.0.0.1:0", false, net.Listen)
	if err != nil || udp != nil {
		t.Fatalf("cleartext: %v, UDP %v: want a TCP listener alone", err, udp)
	}
	plain.Close()
}

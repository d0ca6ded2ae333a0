// Package quicdial dials QUIC connections from a UDP socket bound to one
// local address, never to every interface: quic.DialAddr binds 0.0.0.0,
// which leaves a client socket any host on any interface can send to. Each
// connection gets its own socket (quic-go runs a socket's packets on one
// goroutine, so connections on separate sockets use separate cores),
// closed when the connection ends.
package quicdial

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/quic-go/quic-go"
)

// Dial connects to addr from a socket bound to local, or, when local is
// nil or unspecified, to the address the kernel would send to addr from
// (loopback for a loopback peer).
func Dial(ctx context.Context, local net.IP, addr string, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("quicdial: %s: %w", addr, err)
	}
	if local == nil || local.IsUnspecified() {
		if local, err = SourceFor(raddr); err != nil {
			return nil, err
		}
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: local})
	if err != nil {
		return nil, fmt.Errorf("quicdial: bind %s: %w", local, err)
	}
	conn, err := quic.Dial(ctx, udp, raddr, tlsConf, conf)
	if err != nil {
		udp.Close()
		return nil, err
	}
	// The connection's context ends after its CONNECTION_CLOSE was sent.
	context.AfterFunc(conn.Context(), func() { udp.Close() })
	return conn, nil
}

// SourceFor is the local address the kernel routes packets to raddr from:
// a connected UDP socket's address (connecting one sends nothing).
func SourceFor(raddr *net.UDPAddr) (net.IP, error) {
	c, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil, fmt.Errorf("quicdial: no route to %s: %w", raddr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}

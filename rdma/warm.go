package rdma

import "context"

// Warm dials what a fetch from the source at addr would use — its Conns
// QUIC connections and, where it offers one, its data path — so that the
// first pull after a failure starts at once instead of after handshakes.
// Connections already up are kept; QUIC keep-alives hold them open.
func (q *QUIC) Warm(ctx context.Context, addr string) error {
	for i := range max(1, q.Conns) {
		if _, err := q.Conn(ctx, addr, i); err != nil {
			return err
		}
	}
	if q.TCP {
		q.dataPath(ctx, addr)
	}
	return nil
}

// Warmed reports whether connection 0 to addr is up (the one every fetch
// and pull request uses first).
func (q *QUIC) Warmed(addr string) bool { return q.Dialer.Cached(addr, 0) }

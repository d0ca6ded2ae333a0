package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/shm"
)

// transferTotal is how many payload bytes each measurement moves.
const transferTotal = 256 << 20

// runTransferBench moves the same published blocks from one real arena
// owner to another's arena on this machine: memcpy between the mappings,
// the transfer framing over one plain TCP stream, and the QUIC transport
// (TLS 1.3) with 1, 4 and 8 parallel streams, next to a stock quic-go
// configuration on one stream.
func runTransferBench() error {
	fmt.Printf("\n## KV transfer throughput (loopback, %d MiB per run, median of 3)\n\n", transferTotal>>20)
	certs, err := os.MkdirTemp("", "lifeline-bench-certs")
	if err != nil {
		return err
	}
	defer os.RemoveAll(certs)
	agentCerts, err := pki.InitIdentity(certs, pki.Agent("bench"))
	if err != nil {
		return err
	}
	tlsConf, err := transferclient.TLS(agentCerts)
	if err != nil {
		return err
	}
	fmt.Printf("| block | memcpy GB/s | TCP 1 stream GB/s | QUIC stock 1 stream | QUIC 1 stream | QUIC 4 streams, 1 conn | QUIC 4 streams, 2 conns | QUIC 4 streams, 4 conns | QUIC best / TCP |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, size := range []int{64 << 10, 1 << 20, 8 << 20} {
		row, err := transferRow(size, tlsConf)
		if err != nil {
			return err
		}
		best := max(row[3], row[4], row[5], row[6])
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | **%.2f×** |\n", sizeName(size), row[0], row[1], row[2], row[3], row[4], row[5], row[6], best/row[1])
	}
	fmt.Printf("\nQUIC stock: quic-go's default configuration. The other QUIC columns: the transport's configuration (large flow-control windows), one fetch split over n streams spread over m connections, blocks read straight into the destination's WRITING slots. Sender and receiver share this machine's cores.\n")
	return nil
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// transferRow returns GB/s for memcpy, TCP, stock QUIC, QUIC 1/4/8 streams.
func transferRow(size int, tlsConf *tls.Config) ([7]float64, error) {
	var row [7]float64
	n := transferTotal / size
	src, err := newBenchOwner(n, size)
	if err != nil {
		return row, err
	}
	defer src.stop()
	dst, err := newBenchOwner(n, size)
	if err != nil {
		return row, err
	}
	defer dst.stop()
	// n published blocks on the source.
	sid, _, _, err := src.owner.Hello(kv.Writer{Instance: "bench-source", Gen: 1}, nil, nil)
	if err != nil {
		return row, err
	}
	refs, err := src.owner.Allocate(sid, n)
	if err != nil {
		return row, err
	}
	keys := make([]kv.BlockKey, n)
	for i, r := range refs {
		p := src.owner.Arena().Payload(int(r.Slot))[:size]
		rand.Read(p)
		keys[i] = sha256.Sum256([]byte(fmt.Sprint("bench-block-", size, "-", i)))
		r.PayloadLen, r.Checksum = uint32(size), shm.Checksum(p)
		parent := kv.BlockKey{}
		if i > 0 {
			parent = keys[i-1]
		}
		if err := src.owner.Seal(sid, r, keys[i], parent); err != nil {
			return row, err
		}
		if err := src.owner.Publish(sid, r); err != nil {
			return row, err
		}
	}
	// The destination's WRITING slots, written by every run.
	dsid, _, _, err := dst.owner.Hello(kv.Writer{Instance: "bench-destination", Gen: 1}, nil, nil)
	if err != nil {
		return row, err
	}
	drefs, err := dst.owner.Allocate(dsid, n)
	if err != nil {
		return row, err
	}
	into := func(i int, h *transferpb.BlockHeader) ([]byte, error) {
		return dst.owner.Arena().Payload(int(drefs[i].Slot))[:h.PayloadLen], nil
	}
	f := &transferpb.Fetch{Binding: &transferpb.Binding{RequestId: "bench", DestinationInstance: "bench", TransferEpoch: 1, BlockCount: uint32(n)},
		Keys: blockid.KeyBytes(keys), Count: uint32(n)}
	gbs := func(run func() error) (float64, error) {
		return median3(func() (float64, error) {
			start := time.Now()
			if err := run(); err != nil {
				return 0, err
			}
			return float64(n*size) / time.Since(start).Seconds() / 1e9, nil
		})
	}
	fetched := func(got int, err error) error {
		if err == nil && got != n {
			err = fmt.Errorf("fetched %d of %d blocks", got, n)
		}
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// memcpy between the two mappings.
	if row[0], err = gbs(func() error {
		for i, r := range refs {
			copy(dst.owner.Arena().Payload(int(drefs[i].Slot))[:size], src.owner.Arena().Payload(int(r.Slot))[:size])
		}
		return nil
	}); err != nil {
		return row, err
	}

	engine := rdma.NewEngine(src.owner, nil)
	// One plain TCP stream with the same framing.
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return row, err
	}
	defer tln.Close()
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() { engine.ServeStream(ctx, c); c.Close() }()
		}
	}()
	if row[1], err = gbs(func() error {
		return fetched(rdma.FetchParallel(ctx, f, 1, func(context.Context) (io.ReadWriteCloser, func(), error) {
			c, err := net.Dial("tcp", tln.Addr().String())
			if err != nil {
				return nil, nil, err
			}
			return c, func() { c.Close() }, nil
		}, into))
	}); err != nil {
		return row, err
	}

	// QUIC: stock quic-go configuration on both ends, one stream.
	stockLn, err := quic.ListenAddr("127.0.0.1:0", tlsConf, nil)
	if err != nil {
		return row, err
	}
	defer stockLn.Close()
	go engine.Serve(ctx, stockLn)
	stock, err := quic.DialAddr(ctx, stockLn.Addr().String(), tlsConf, nil)
	if err != nil {
		return row, err
	}
	defer stock.CloseWithError(0, "")
	if row[2], err = gbs(func() error {
		return fetched(rdma.FetchParallel(ctx, f, 1, func(ctx context.Context) (io.ReadWriteCloser, func(), error) {
			st, err := stock.OpenStreamSync(ctx)
			if err != nil {
				return nil, nil, err
			}
			return st, func() { st.Close() }, nil
		}, into))
	}); err != nil {
		return row, err
	}

	// The transport as agents run it.
	qln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, transferclient.QUICConfig())
	if err != nil {
		return row, err
	}
	defer qln.Close()
	go engine.Serve(ctx, qln)
	for i, shape := range [][2]int{{1, 1}, {4, 1}, {4, 2}, {4, 4}} {
		q := rdma.NewQUIC(tlsConf)
		q.Streams, q.Conns, q.Stall = shape[0], shape[1], 10*time.Second
		if row[3+i], err = gbs(func() error { return fetched(q.Fetch(ctx, qln.Addr().String(), f, into)) }); err != nil {
			q.Close()
			return row, err
		}
		q.Close()
	}
	return row, nil
}

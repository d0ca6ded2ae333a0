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
	"slices"
	"syscall"
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
	fmt.Printf("| block | memcpy GB/s | TCP 1 stream GB/s | QUIC stock 1 stream | QUIC 1 stream | QUIC 4 streams, 1 conn | QUIC 4 streams, 2 conns | QUIC 4 streams, 4 conns | transport: TLS/TCP data path | QUIC best / TCP | transport / TCP |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	var rows []transferResult
	for _, size := range []int{64 << 10, 128 << 10, 1 << 20, 8 << 20} {
		r, err := transferRow(size, tlsConf)
		if err != nil {
			return err
		}
		rows = append(rows, r)
		g := r.gbs
		best := max(g[3], g[4], g[5], g[6])
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f× | **%.2f×** |\n", sizeName(size), g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], best/g[1], g[7]/g[1])
	}
	// CPU per byte does not depend on what else shares the cores: the
	// ratio that says what each path can reach once it has them.
	fmt.Printf("\nCPU per byte moved (both ends, this process's user+system time, median of 3):\n\n| block | TCP 1 stream ns/B | QUIC 1 stream ns/B | QUIC 4 streams, 1 conn ns/B | transport: TLS/TCP ns/B | TCP / QUIC 1 stream | TCP / transport |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		c := r.cpu
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f× | **%.2f×** |\n", sizeName(r.size), c[1], c[3], c[4], c[7], c[1]/c[3], c[1]/c[7])
	}
	fmt.Printf("\nTCP 1 stream: the transfer framing over one plaintext TCP connection (the baseline). QUIC stock: quic-go's default configuration. The other QUIC columns: the transport's QUIC configuration (large flow-control windows) with its TCP data path off, one fetch split over n streams spread over m connections, blocks read straight into the destination's WRITING slots. Transport: the transport as agents run it: the data path offered over QUIC, one TLS 1.3 (mutual, same certificates) TCP connection per fetch, checked to present the QUIC endpoint's certificate. Sender and receiver share this machine's cores.\n")
	return nil
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// transferResult is one block size's GB/s and CPU nanoseconds per byte
// for memcpy, TCP, stock QUIC, QUIC with 1 and 4 streams over 1, 2 and 4
// connections, and the transport's TCP data path.
type transferResult struct {
	size     int
	gbs, cpu [8]float64
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func transferRow(size int, tlsConf *tls.Config) (transferResult, error) {
	row := transferResult{size: size}
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
	measure := func(col int, run func() error) error {
		var g, c [3]float64
		for i := range g {
			start, cpu := time.Now(), cpuTime()
			if err := run(); err != nil {
				return err
			}
			g[i] = float64(n*size) / time.Since(start).Seconds() / 1e9
			c[i] = float64(cpuTime()-cpu) / float64(n*size)
		}
		slices.Sort(g[:])
		slices.Sort(c[:])
		row.gbs[col], row.cpu[col] = g[1], c[1]
		return nil
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
	if err = measure(0, func() error {
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
	if err = measure(1, func() error {
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
	if err = measure(2, func() error {
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
		q.Streams, q.Conns, q.Stall, q.TCP = shape[0], shape[1], 10*time.Second, false
		if err = measure(3+i, func() error { return fetched(q.Fetch(ctx, qln.Addr().String(), f, into)) }); err != nil {
			q.Close()
			return row, err
		}
		q.Close()
	}
	// The TLS-over-TCP data path, offered over the QUIC endpoint.
	dln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return row, err
	}
	defer dln.Close()
	go engine.ServeTCP(ctx, dln, tlsConf)
	q := rdma.NewQUIC(tlsConf)
	defer q.Close()
	q.Stall = 10 * time.Second
	err = measure(7, func() error { return fetched(q.Fetch(ctx, qln.Addr().String(), f, into)) })
	return row, err
}

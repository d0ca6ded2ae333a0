//go:build rdma

package rdma

/*
#cgo LDFLAGS: -libverbs
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

// probe opens the named device, allocates a protection domain, registers a
// buffer for remote reads and queries port 1. It returns 0 and the port
// state, or a negative step number on failure.
static int probe(const char *name, int *port_state, int *active_mtu) {
	int n = 0, rc = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) return -1;
	struct ibv_context *ctx = NULL;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			ctx = ibv_open_device(list[i]);
			break;
		}
	}
	ibv_free_device_list(list);
	if (!ctx) return -2;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) { ibv_close_device(ctx); return -3; }
	size_t len = 1 << 20;
	void *buf = calloc(1, len);
	struct ibv_mr *mr = buf ? ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
	if (!mr) { rc = -4; goto out; }
	struct ibv_port_attr attr;
	if (ibv_query_port(ctx, 1, &attr)) { rc = -5; goto out; }
	*port_state = attr.state;
	*active_mtu = attr.active_mtu;
	rc = 0;
out:
	if (mr) ibv_dereg_mr(mr);
	free(buf);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return rc;
}

// ll_dev is one opened device with the node's arena registered as one
// memory region, on port 1 and GID index 0.
typedef struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	union ibv_gid gid;
	int gid_index;
	uint16_t lid;
	enum ibv_mtu mtu;
	int rd_atomic; // min of the device's responder and initiator limits, at most 16
	int err;       // errno of the failed step
} ll_dev;

static int ll_dev_open(const char *name, int gid_index, void *buf, size_t len, ll_dev *d) {
	memset(d, 0, sizeof *d);
	d->gid_index = gid_index;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) return -1;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			d->ctx = ibv_open_device(list[i]);
			break;
		}
	}
	ibv_free_device_list(list);
	if (!d->ctx) return -2;
	if (!(d->pd = ibv_alloc_pd(d->ctx))) { d->err = errno; return -3; }
	// The arena is read remotely by peers (source side) and written
	// locally by READ responses (destination side).
	if (!(d->mr = ibv_reg_mr(d->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ))) { d->err = errno; return -4; }
	struct ibv_port_attr pa;
	if (ibv_query_port(d->ctx, 1, &pa)) { d->err = errno; return -5; }
	if (pa.state != IBV_PORT_ACTIVE) return -6;
	d->lid = pa.lid;
	d->mtu = pa.active_mtu;
	if (ibv_query_gid(d->ctx, 1, gid_index, &d->gid)) { d->err = errno; return -7; }
	struct ibv_device_attr da;
	if (ibv_query_device(d->ctx, &da)) { d->err = errno; return -8; }
	d->rd_atomic = 16;
	if (da.max_qp_rd_atom < d->rd_atomic) d->rd_atomic = da.max_qp_rd_atom;
	if (da.max_qp_init_rd_atom < d->rd_atomic) d->rd_atomic = da.max_qp_init_rd_atom;
	if (d->rd_atomic < 1) d->rd_atomic = 1;
	return 0;
}

static void ll_dev_close(ll_dev *d) {
	if (d->mr) ibv_dereg_mr(d->mr);
	if (d->pd) ibv_dealloc_pd(d->pd);
	if (d->ctx) ibv_close_device(d->ctx);
	memset(d, 0, sizeof *d);
}

static uint32_t ll_rkey(ll_dev *d) { return d->mr->rkey; }

// ll_qp is a reliable-connected queue pair with its completion queue.
typedef struct {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint32_t psn;
} ll_qp;

// access is the remote access this queue pair grants its peer: READ on a
// source, nothing on a destination.
static int ll_qp_create(ll_dev *d, int depth, uint32_t psn, int access, ll_qp *q) {
	memset(q, 0, sizeof *q);
	if (!(q->cq = ibv_create_cq(d->ctx, depth, NULL, NULL, 0))) return -1;
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = q->cq;
	ia.recv_cq = q->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = depth;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	if (!(q->qp = ibv_create_qp(d->pd, &ia))) return -2;
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -3;
	q->psn = psn & 0xffffff;
	return 0;
}

static uint32_t ll_qpn(ll_qp *q) { return q->qp->qp_num; }

// ll_qp_connect moves the queue pair to ready-to-send against the peer's,
// with the path MTU and read depth both sides allow.
static int ll_qp_connect(ll_dev *d, ll_qp *q, uint32_t rqpn, uint32_t rpsn, uint16_t rlid, const uint8_t *rgid, int mtu, int rd_atomic) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn & 0xffffff;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = rlid;
	a.ah_attr.port_num = 1;
	if (rgid) {
		a.ah_attr.is_global = 1;
		memcpy(&a.ah_attr.grh.dgid, rgid, 16);
		a.ah_attr.grh.sgid_index = d->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	if (ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = q->psn;
	a.max_rd_atomic = rd_atomic;
	if (ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		IBV_QP_MAX_QP_RD_ATOMIC)) return -2;
	return 0;
}

// ll_read posts one signalled RDMA READ of len bytes from the peer's
// raddr into laddr (inside the registered region).
static int ll_read(ll_dev *d, ll_qp *q, uint64_t laddr, uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t id) {
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = d->mr->lkey };
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(q->qp, &wr, &bad);
}

// ll_poll returns 1 and one completion, 0 when none is ready, <0 on error.
static int ll_poll(ll_qp *q, uint64_t *id, int *status) {
	struct ibv_wc wc;
	int n = ibv_poll_cq(q->cq, 1, &wc);
	if (n <= 0) return n;
	*id = wc.wr_id;
	*status = wc.status;
	return 1;
}

static void ll_qp_destroy(ll_qp *q) {
	if (q->qp) ibv_destroy_qp(q->qp);
	if (q->cq) ibv_destroy_cq(q->cq);
}
*/
import "C"

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

const verbsBuilt = true

// verbsStatus probes each device with libibverbs and picks the first one
// whose port 1 is active.
func verbsStatus(devices []string) (reason, device string) {
	var notes []string
	for _, d := range devices {
		name := C.CString(d)
		var state, mtu C.int
		rc := C.probe(name, &state, &mtu)
		C.free(unsafe.Pointer(name))
		switch {
		case rc < 0:
			notes = append(notes, fmt.Sprintf("%s: %s failed", d, verbsSteps[rc]))
		case state != C.IBV_PORT_ACTIVE:
			notes = append(notes, fmt.Sprintf("%s: port 1 not active (state %d)", d, int(state)))
		default:
			return fmt.Sprintf("%s port 1 active: payloads by RDMA READ, control and fallback over QUIC (never run on RDMA hardware by the project's tests)", d), d
		}
	}
	return "verbs probe: " + strings.Join(notes, "; ") + ": QUIC between agents", ""
}

var verbsSteps = map[C.int]string{-1: "ibv_get_device_list", -2: "ibv_open_device", -3: "ibv_alloc_pd", -4: "ibv_reg_mr",
	-5: "ibv_query_port", -6: "port 1 not active", -7: "ibv_query_gid", -8: "ibv_query_device"}

// verbsDev is a device with the node's whole arena registered as one
// memory region: sources read from it remotely, destinations write into
// it locally.
type verbsDev struct {
	d    C.ll_dev
	base uintptr
	size uintptr
}

func (v *verbsDev) endpoint(q *C.ll_qp) *transferpb.VerbsEndpoint {
	return &transferpb.VerbsEndpoint{Qpn: uint32(C.ll_qpn(q)), Psn: uint32(q.psn), Lid: uint32(v.d.lid), Gid: C.GoBytes(unsafe.Pointer(&v.d.gid), 16),
		Mtu: uint32(v.d.mtu), RdAtomic: uint32(v.d.rd_atomic)}
}

// newQP creates a queue pair; source ones grant their peer remote reads,
// destination ones grant nothing.
func (v *verbsDev) newQP(depth int, source bool) (*C.ll_qp, error) {
	q := (*C.ll_qp)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ll_qp{}))))
	if q == nil {
		return nil, errors.New("rdma: out of memory for a queue pair")
	}
	access := C.int(0)
	if source {
		access = C.IBV_ACCESS_REMOTE_READ
	}
	if rc := C.ll_qp_create(&v.d, C.int(depth), C.uint32_t(rand.Uint32()), access, q); rc != 0 {
		C.ll_qp_destroy(q)
		C.free(unsafe.Pointer(q))
		return nil, fmt.Errorf("rdma: create queue pair: step %d", int(rc))
	}
	return q, nil
}

func freeQP(q *C.ll_qp) {
	C.ll_qp_destroy(q)
	C.free(unsafe.Pointer(q))
}

func (v *verbsDev) connect(q *C.ll_qp, peer *transferpb.VerbsEndpoint) error {
	if peer == nil || len(peer.Gid) != 16 || peer.Mtu == 0 || peer.RdAtomic == 0 {
		return fmt.Errorf("%w: bad verbs endpoint", ErrBadTransfer)
	}
	gid := C.CBytes(peer.Gid)
	defer C.free(gid)
	mtu := min(C.int(v.d.mtu), C.int(peer.Mtu))
	rd := min(v.d.rd_atomic, C.int(peer.RdAtomic))
	if rc := C.ll_qp_connect(&v.d, q, C.uint32_t(peer.Qpn), C.uint32_t(peer.Psn), C.uint16_t(peer.Lid), (*C.uint8_t)(gid), mtu, rd); rc != 0 {
		return fmt.Errorf("rdma: connect queue pair: step %d", int(rc))
	}
	return nil
}

// verbs is the RDMA verbs transport and the source side of it.
type verbs struct {
	dev    *verbsDev
	ctrl   *QUIC
	engine *Engine
	once   sync.Once
}

// OpenVerbs registers the engine's arena with the device and returns the
// RDMA transport: QUIC carries the queue-pair exchange and the block list,
// RDMA READ moves the payloads straight into the destination's WRITING
// slots, and a fetch that fails over verbs is retried over QUIC. The
// engine then serves verbs fetches too.
func OpenVerbs(e *Engine, device string, gidIndex int, ctrl *QUIC) (Transport, error) {
	mem := e.owner.Arena().Mem()
	if len(mem) == 0 {
		return nil, errors.New("rdma: empty arena")
	}
	v := &verbsDev{base: uintptr(unsafe.Pointer(&mem[0])), size: uintptr(len(mem))}
	name := C.CString(device)
	defer C.free(unsafe.Pointer(name))
	if rc := C.ll_dev_open(name, C.int(gidIndex), unsafe.Pointer(&mem[0]), C.size_t(len(mem)), &v.d); rc != 0 {
		errno := syscall.Errno(v.d.err)
		C.ll_dev_close(&v.d)
		return nil, fmt.Errorf("rdma: %s: %s failed (%v)", device, verbsSteps[rc], errno)
	}
	t := &verbs{dev: v, ctrl: ctrl, engine: e}
	e.verbs = t
	return t, nil
}

func (t *verbs) Name() string { return "rdma" }

// Close stops serving verbs fetches and closes the device; the engine
// must have stopped serving streams (the agent closes it last).
func (t *verbs) Close() error {
	t.once.Do(func() {
		t.engine.verbs = nil
		C.ll_dev_close(&t.dev.d)
	})
	return t.ctrl.Close()
}

// Fetch implements Transport.
func (t *verbs) Fetch(ctx context.Context, addr string, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	n, err := t.fetch(ctx, addr, f, into)
	if err != nil && ctx.Err() == nil && !errors.Is(err, ErrBadTransfer) && !errors.Is(err, errNoControl) {
		return t.ctrl.Fetch(ctx, addr, f, into)
	}
	return n, err
}

// errNoControl: the source's QUIC endpoint, which the RDMA offer is
// asked on and the QUIC fallback would fetch from, did not answer; the
// fallback would only wait out a second dial.
var errNoControl = errors.New("rdma: the source's control stream")

func (t *verbs) fetch(ctx context.Context, addr string, f *transferpb.Fetch, into func(int, *transferpb.BlockHeader) ([]byte, error)) (int, error) {
	q, err := t.dev.newQP(int(min(f.Count, maxReadsInFlight))+1, false)
	if err != nil {
		return 0, err
	}
	defer freeQP(q)
	st, _, stop, err := t.ctrl.Stream(ctx, addr, 0)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errNoControl, err)
	}
	defer stop()
	defer st.Close()
	offer, err := t.requestOffer(st, f, q)
	if err != nil {
		return 0, err
	}
	if err := t.dev.connect(q, offer.Endpoint); err != nil {
		return 0, err
	}
	if err := t.readBlocks(ctx, q, offer, into); err != nil {
		return 0, err
	}
	if err := frame.Write(st, &transferpb.VerbsDone{Read: uint32(len(offer.Blocks))}); err != nil {
		return 0, err
	}
	return len(offer.Blocks), nil
}

// maxReadsInFlight bounds the RDMA READs one fetch has posted and not yet
// seen complete.
const maxReadsInFlight = 256

// requestOffer sends the fetch and our queue pair on the control stream
// and reads the source's offer: its queue pair and where each block lies.
func (t *verbs) requestOffer(st *quic.Stream, f *transferpb.Fetch, q *C.ll_qp) (*transferpb.VerbsOffer, error) {
	req := &transferpb.VerbsFetch{Fetch: f, Endpoint: t.dev.endpoint(q)}
	if err := frame.Write(st, &transferpb.Request{Op: &transferpb.Request_VerbsFetch{VerbsFetch: req}}); err != nil {
		return nil, err
	}
	br := bufio.NewReader(&stallStream{Stream: st, stall: t.ctrl.Stall})
	var offer transferpb.VerbsOffer
	if err := frame.Read(br, &offer); err != nil {
		return nil, readErr(err)
	}
	if offer.Error != "" {
		return nil, fmt.Errorf("rdma: source: %s", offer.Error)
	}
	if len(offer.Blocks) > int(f.Count) {
		return nil, fmt.Errorf("%w: source offers %d of %d blocks", ErrBadTransfer, len(offer.Blocks), f.Count)
	}
	return &offer, nil
}

// readBlocks posts one RDMA READ per offered block, straight into the
// buffer into gives for it, and waits until every read completed.
func (t *verbs) readBlocks(ctx context.Context, q *C.ll_qp, offer *transferpb.VerbsOffer, into func(int, *transferpb.BlockHeader) ([]byte, error)) error {
	cq := completions{ctx: ctx, q: q, stall: t.ctrl.Stall}
	for i, b := range offer.Blocks {
		if b.Header == nil || b.Header.Index != uint32(i) {
			return fmt.Errorf("%w: block %d out of order", ErrBadTransfer, i)
		}
		buf, err := into(i, b.Header)
		if err != nil {
			return err
		}
		if len(buf) == 0 {
			continue
		}
		laddr := uintptr(unsafe.Pointer(&buf[0]))
		if laddr < t.dev.base || laddr+uintptr(len(buf)) > t.dev.base+t.dev.size {
			// A local matter, not the source's: QUIC can still do it.
			return fmt.Errorf("rdma: block %d's buffer lies outside the registered arena", i)
		}
		if cq.outstanding >= maxReadsInFlight {
			if err := cq.wait(cq.outstanding - 1); err != nil {
				return err
			}
		}
		if rc := C.ll_read(&t.dev.d, q, C.uint64_t(laddr), C.uint32_t(len(buf)), C.uint64_t(b.Addr), C.uint32_t(offer.Rkey), C.uint64_t(i)); rc != 0 {
			return fmt.Errorf("rdma: post read of block %d: errno %d", i, int(rc))
		}
		cq.outstanding++
	}
	return cq.wait(0)
}

// completions counts the reads posted on a queue pair and waits for them.
type completions struct {
	ctx         context.Context
	q           *C.ll_qp
	stall       time.Duration
	outstanding int
}

// wait polls the completion queue until at most until reads are
// outstanding. A read that fails, ctx ending, or no completion for the
// stall time ends the wait with an error.
func (c *completions) wait(until int) error {
	deadline := time.Now().Add(c.stall)
	for c.outstanding > until {
		var id C.uint64_t
		var status C.int
		switch rc := C.ll_poll(c.q, &id, &status); {
		case rc < 0:
			return fmt.Errorf("rdma: poll completion queue: %d", int(rc))
		case rc == 0:
			if c.ctx.Err() != nil {
				return c.ctx.Err()
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("rdma: source stalled: no completion for %v", c.stall)
			}
			time.Sleep(20 * time.Microsecond)
		case status != C.IBV_WC_SUCCESS:
			return fmt.Errorf("rdma: read of block %d failed: %s", uint64(id), C.GoString(C.ibv_wc_status_str(uint32(status))))
		default:
			c.outstanding--
			deadline = time.Now().Add(c.stall)
		}
	}
	return nil
}

// serve is the source side: lease the blocks, offer where they lie, and
// hold them until the destination has read them (or goes away).
func (t *verbs) serve(e *Engine, vf *transferpb.VerbsFetch, r *bufio.Reader, w *bufio.Writer) error {
	refuse := func(msg string) error {
		if err := frame.Write(w, &transferpb.VerbsOffer{Error: msg}); err != nil {
			return err
		}
		return w.Flush()
	}
	if vf.Fetch == nil {
		return refuse("no fetch")
	}
	blocks, end, err := e.openFetch(vf.Fetch)
	if err != nil {
		return refuse(err.Error())
	}
	defer end()
	q, err := t.dev.newQP(1, true)
	if err != nil {
		return refuse(err.Error())
	}
	defer freeQP(q)
	if err := t.dev.connect(q, vf.Endpoint); err != nil {
		return refuse(err.Error())
	}
	offer := &transferpb.VerbsOffer{Endpoint: t.dev.endpoint(q), Rkey: uint32(C.ll_rkey(&t.dev.d))}
	for _, b := range blocks {
		offer.Blocks = append(offer.Blocks, &transferpb.VerbsBlock{Header: b.header, Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b.payload))))})
	}
	if err := frame.Write(w, offer); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// The leases hold the slots until the reads are done.
	var done transferpb.VerbsDone
	if err := frame.Read(r, &done); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for _, b := range blocks[:min(int(done.Read), len(blocks))] {
		e.blocksServed.Add(1)
		e.bytesServed.Add(uint64(len(b.payload)))
	}
	return nil
}

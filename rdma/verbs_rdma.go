//go:build rdma

package rdma

/*
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

// probe opens the named device, allocates a protection domain, registers a
// buffer for remote reads and queries port 1: everything a verbs data path
// needs before it exchanges queue pairs. It returns 0 and the port state,
// or a negative step number on failure.
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
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

const verbsBuilt = true

var probeSteps = map[int]string{-1: "ibv_get_device_list", -2: "ibv_open_device", -3: "ibv_alloc_pd", -4: "ibv_reg_mr", -5: "ibv_query_port"}

// verbsStatus probes each device with libibverbs. The verbs data path
// (queue-pair exchange over the QUIC control stream, then RDMA READ into
// the destination's WRITING slots) is not built yet: even with an active
// port the agents move blocks over QUIC, and the status says so.
func verbsStatus(devices []string) string {
	var notes []string
	for _, d := range devices {
		name := C.CString(d)
		var state, mtu C.int
		rc := C.probe(name, &state, &mtu)
		C.free(unsafe.Pointer(name))
		switch {
		case rc < 0:
			notes = append(notes, fmt.Sprintf("%s: %s failed", d, probeSteps[int(rc)]))
		case state != C.IBV_PORT_ACTIVE:
			notes = append(notes, fmt.Sprintf("%s: port 1 not active (state %d)", d, int(state)))
		default:
			notes = append(notes, fmt.Sprintf("%s: port 1 active, PD and MR registration work", d))
		}
	}
	return "verbs probe: " + strings.Join(notes, "; ") + "; the verbs data path is not built yet: QUIC between agents"
}

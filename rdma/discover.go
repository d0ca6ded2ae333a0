package rdma

import (
	"fmt"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// Status says which transport a node uses and why.
type Status struct {
	Transport string   `json:"transport"`
	Reason    string   `json:"reason"`
	Devices   []string `json:"rdma_devices"`
	// Device is the RDMA device the verbs transport uses ("" for QUIC).
	Device string `json:"rdma_device,omitempty"`
	// VerbsBuilt reports whether this binary has the verbs transport
	// (build tag rdma).
	VerbsBuilt bool `json:"verbs_built"`
}

// Discover looks for RDMA devices (github.com/Mellanox/rdmamap reads
// /sys/class/infiniband) and picks the transport.
func Discover() Status {
	st := Status{Transport: "quic", Devices: rdmamap.GetRdmaDeviceList(), VerbsBuilt: verbsBuilt}
	switch {
	case len(st.Devices) == 0:
		st.Reason = "no RDMA devices (nothing under /sys/class/infiniband): QUIC between agents"
	case !verbsBuilt:
		st.Reason = fmt.Sprintf("RDMA devices %s present, but this binary was built without the rdma tag: QUIC between agents", strings.Join(st.Devices, ","))
	default:
		st.Reason, st.Device = verbsStatus(st.Devices)
		if st.Device != "" {
			st.Transport = "rdma"
		}
	}
	return st
}

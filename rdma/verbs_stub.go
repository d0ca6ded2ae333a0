//go:build !rdma

package rdma

import "errors"

const verbsBuilt = false

func verbsStatus([]string) (string, string) { return "", "" }

// OpenVerbs needs the rdma build tag.
func OpenVerbs(e *Engine, device string, gidIndex int, ctrl *QUIC) (Transport, error) {
	return nil, errors.New("rdma: this binary was built without the rdma tag")
}

package agent

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/rdma"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// startTransfer opens the node's KV transfer endpoint: peers fetch this
// node's published blocks from it, and frontends ask it to pull blocks
// for one of this node's instances.
func (a *Agent) startTransfer(ctx context.Context) error {
	a.transport = rdma.Discover()
	a.log.Info("KV transfer transport", "transport", a.transport.Transport, "reason", a.transport.Reason)
	clientConf, err := transferclient.TLS(a.opts.CertDir)
	if err != nil {
		return fmt.Errorf("agent: transfer certs: %w", err)
	}
	tlsConf, err := transferclient.ServerTLS(a.opts.CertDir, func(err error) {
		a.log.Warn("KV transfer endpoint refused a connection", "err", err)
	})
	if err != nil {
		return fmt.Errorf("agent: transfer certs: %w", err)
	}
	tr := rdma.NewQUIC(clientConf)
	a.quic = tr
	a.transfer = rdma.NewEngine(a.kvOwner, tr)
	var closer func() error = tr.Close
	if a.transport.Transport == "rdma" {
		if vt, err := rdma.OpenVerbs(a.transfer, a.transport.Device, a.opts.RDMAGIDIndex, tr); err != nil {
			a.transport.Transport, a.transport.Reason = "quic", fmt.Sprintf("%s; opening it failed (%v): QUIC between agents", a.transport.Reason, err)
			a.log.Warn("RDMA verbs transport unavailable", "err", err)
		} else {
			a.transfer.UseTransport(vt)
			closer = vt.Close
		}
	}
	a.transfer.Current = a.currentBinding
	a.registerTransferMetrics()
	// With port 0, come back on the port of the previous run when it is
	// free: adopted workers were told that address.
	remembered := filepath.Join(a.opts.DataDir, "kv-transfer.addr")
	var ln *quic.Listener
	if _, port, _ := net.SplitHostPort(a.opts.TransferListen); port == "0" {
		if prev, err := os.ReadFile(remembered); err == nil {
			ln, _ = quic.ListenAddr(strings.TrimSpace(string(prev)), tlsConf, transferclient.QUICConfig())
		}
	}
	if ln == nil {
		if ln, err = quic.ListenAddr(a.opts.TransferListen, tlsConf, transferclient.QUICConfig()); err != nil {
			closer()
			return fmt.Errorf("agent: transfer_listen %s: %w", a.opts.TransferListen, err)
		}
	}
	os.WriteFile(remembered, []byte(ln.Addr().String()), 0o600)
	// Pulls from peers leave from the transfer interface (an unspecified
	// listen address leaves the choice to the route to each peer).
	if ip := ln.Addr().(*net.UDPAddr).IP; !ip.IsUnspecified() {
		tr.Local = ip
	}
	a.kvAddr = ln.Addr().String()
	if a.opts.TransferAdvertise != "" {
		a.kvAddr = a.opts.TransferAdvertise
	}
	a.track(func() {
		defer closer()
		a.track(func() { <-ctx.Done(); ln.Close() })
		if err := a.transfer.Serve(ctx, ln); err != nil {
			a.log.Error("KV transfer endpoint stopped", "err", err)
		}
	})
	a.serveDataPath(ctx, ln.Addr().(*net.UDPAddr), tlsConf)
	return nil
}

// serveDataPath opens the TLS-over-TCP data path beside the QUIC endpoint
// (the same address): peers that ask over
// QUIC fetch bulk blocks on it, at a fraction of QUIC's CPU per byte. It is
// an optimisation: without it every fetch stays on QUIC.
func (a *Agent) serveDataPath(ctx context.Context, at *net.UDPAddr, tlsConf *tls.Config) {
	// A port of the kernel's choosing: the offer carries it.
	tln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: at.IP})
	if err != nil {
		a.log.Warn("KV transfer data path unavailable: fetches from this node stay on QUIC", "err", err)
		return
	}
	a.track(func() {
		a.track(func() { <-ctx.Done(); tln.Close() })
		if err := a.transfer.ServeTCP(ctx, tln, tlsConf); err != nil && ctx.Err() == nil {
			a.log.Error("KV transfer data path stopped", "err", err)
		}
	})
}

// currentBinding accepts a transfer only for an instance of this node at
// the bound generation, serving the bound model revision.
func (a *Agent) currentBinding(b *transferpb.Binding) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	inst, ok := a.instances[b.DestinationInstance]
	switch {
	case !ok:
		return fmt.Errorf("no instance %s on node %s", b.DestinationInstance, a.opts.NodeID)
	case inst.gen != b.DestinationGeneration:
		return fmt.Errorf("%s is at generation %d, not %d", b.DestinationInstance, inst.gen, b.DestinationGeneration)
	case b.ModelRevision != "" && inst.revision != "" && inst.revision != b.ModelRevision:
		return fmt.Errorf("%s serves revision %s, not %s", b.DestinationInstance, inst.revision, b.ModelRevision)
	}
	return nil
}

func (a *Agent) registerTransferMetrics() {
	counter := func(name, help string, f func(rdma.Stats) uint64) {
		a.metrics.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(a.transfer.Stats())) }))
	}
	counter("lifeline_agent_kv_transfer_pulls_ok_total", "Pulls that left the chain published here.", func(s rdma.Stats) uint64 { return s.PullsOK })
	counter("lifeline_agent_kv_transfer_pulls_failed_total", "Pulls no source could serve (the request recomputes).", func(s rdma.Stats) uint64 { return s.PullsFailed })
	counter("lifeline_agent_kv_transfer_stale_dropped_total", "Transfers whose binding was not current: dropped, nothing published.", func(s rdma.Stats) uint64 { return s.StaleDropped })
	counter("lifeline_agent_kv_transfer_blocks_pulled_total", "KV blocks fetched from peers, verified and published.", func(s rdma.Stats) uint64 { return s.BlocksPulled })
	counter("lifeline_agent_kv_transfer_bytes_pulled_total", "Payload bytes fetched from peers and published.", func(s rdma.Stats) uint64 { return s.BytesPulled })
	counter("lifeline_agent_kv_transfer_blocks_served_total", "KV blocks sent to peers.", func(s rdma.Stats) uint64 { return s.BlocksServed })
	counter("lifeline_agent_kv_transfer_source_failures_total", "Sources that failed, stalled or lacked the blocks during a pull.", func(s rdma.Stats) uint64 { return s.SourceFailures })
	counter("lifeline_agent_kv_transfer_checksum_errors_total", "Fetched blocks whose checksum did not verify (the source is dropped).", func(s rdma.Stats) uint64 { return s.ChecksumErrors })
	counter("lifeline_agent_kv_transfer_staged_aborted_total", "Staged (WRITING) blocks of failed or stale transfers freed.", func(s rdma.Stats) uint64 { return s.StagedAborted })
}

// nodeRecord describes the node for routers: where to pull its blocks and
// which prefixes it holds. The registrar stamps it when it writes it.
func (a *Agent) nodeRecord() schema.NodeRecord {
	r := schema.NodeRecord{Node: a.opts.NodeID, KVAddr: a.kvAddr, Transport: a.transport.Transport}
	for _, k := range a.kvOwner.PublishedKeys(schema.MaxSummaryKeys) {
		r.Prefixes = append(r.Prefixes, hex.EncodeToString(k[:8]))
	}
	return r
}

// Package localcluster is `lifeline up`: one machine's whole Lifeline — an
// embedded etcd, certificates, N node agents (each with its own arena,
// Badger directory and control socket) running decode workers as real
// processes, and a frontend — started from nothing and stopped cleanly.
package localcluster

import (
	"fmt"
	"path/filepath"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// Options are the flags of `lifeline up`.
type Options struct {
	DataDir string
	Nodes   int
	Preset  string
	Listen  string
	// Prefill adds prefill instances, placed on the nodes from the last
	// one backwards (with 2+ nodes a hand-off then crosses nodes for the
	// decode instances elsewhere).
	Prefill int
	// Frontends is how many frontends to run (default 1): frontend i
	// listens on Listen's port + i (any free port when Listen's is 0).
	Frontends int
	// Binary is the lifeline executable for the child processes (default:
	// this executable).
	Binary string
	// ArenaMB is each node's KV arena; 0 sizes it from the memory this
	// machine may use (ArenaSize).
	ArenaMB int
	// EtcdMembers, when set, runs etcd as that many member processes
	// (`lifeline etcd`) instead of one member inside this process.
	EtcdMembers int
	// TLS serves the frontends' API over HTTPS and HTTP/3 (one port),
	// with certificates of the cluster's CA.
	TLS bool
	// NetNS puts every node (its agent and workers) in a network
	// namespace of its own on a bridge (root only): a node can then be cut
	// off with real packet loss.
	NetNS bool
	// TP, above 1, runs every decode instance as a tensor-parallel group
	// of TP worker processes.
	TP int
	// Model, a GGUF file or a Hugging Face directory, is served instead
	// of Preset, under ServedName (default: the file's base name without
	// .gguf, or the directory's), its context capped at ContextLen. Engine
	// "lifeline" computes it with the reference engine, "llamacpp"
	// through llama.cpp (a lifeline built with the llamacpp tag; context
	// at most 4,096 by default, GPULayers layers on the GPU with the CUDA
	// backend of make llamacpp-cuda, loaded from LIFELINE_GGML_BACKENDS);
	// "" picks the reference engine when it computes the file and says
	// why not otherwise (EngineNote). Threads: compute threads per
	// worker (0: every CPU).
	Engine     string
	EngineNote string
	Model      string
	ServedName string
	Threads    int
	ContextLen int
	GPULayers  int
}

// ModelID is the model clients ask for: the preset, or the model's
// served name.
func (o *Options) ModelID() string {
	switch {
	case o.Model == "":
		return o.Preset
	case o.ServedName != "":
		return o.ServedName
	}
	return decode.GGUFName(o.Model)
}

// instance is the spec of each node's decode instance.
func (o *Options) instance() agent.InstanceSpec {
	if o.Model != "" {
		return agent.InstanceSpec{Role: "decode", Engine: o.Engine, Model: o.Model, ServedName: o.ServedName,
			Count: 1, Threads: o.Threads, ContextLen: o.ContextLen, GPULayers: o.GPULayers}
	}
	return agent.InstanceSpec{Role: "decode", Preset: o.Preset, Count: 1, TP: o.TP, Threads: o.Threads}
}

// validateModel checks the model options: a model file is checked here,
// before anything starts, made absolute (the agents run elsewhere) and
// given an engine when none was asked for.
func (o *Options) validateModel() error {
	switch {
	case o.Engine != "" && o.Engine != decode.EngineLifeline && o.Engine != decode.EngineLlamaCpp:
		return fmt.Errorf("up: engine: %q (%s or %s)", o.Engine, decode.EngineLifeline, decode.EngineLlamaCpp)
	case o.Threads < 0 || o.ContextLen < 0 || o.GPULayers < 0:
		return fmt.Errorf("up: threads %d, context %d, gpu layers %d: none may be negative", o.Threads, o.ContextLen, o.GPULayers)
	case o.Model == "" && o.Engine == decode.EngineLlamaCpp:
		return fmt.Errorf("up: model: --engine %s serves a GGUF file: --model PATH", decode.EngineLlamaCpp)
	case o.Model == "":
		if o.GPULayers != 0 {
			return fmt.Errorf("up: gpu-layers: layers of a GGUF file served with --engine %s", decode.EngineLlamaCpp)
		}
		if o.Preset != "tiny" && o.Preset != "small" {
			return fmt.Errorf("up: preset: %q (tiny or small)", o.Preset)
		}
		o.Engine = decode.EngineLifeline
		return nil
	case o.Prefill > 0 || o.TP > 1:
		return fmt.Errorf("up: prefill and tp run on a preset, not on a model file")
	}
	abs, err := filepath.Abs(o.Model)
	if err != nil {
		return fmt.Errorf("up: model: %w", err)
	}
	o.Model = abs
	goErr := decode.CheckModel(o.Model)
	switch {
	case o.Engine == "" && goErr == nil && o.GPULayers == 0:
		o.Engine = decode.EngineLifeline
	case o.Engine == "":
		why := fmt.Sprintf("%v", goErr)
		if goErr == nil {
			why = fmt.Sprintf("--gpu-layers %d asks for llama.cpp's GPU backend", o.GPULayers)
		}
		o.Engine, o.EngineNote = decode.EngineLlamaCpp, "served by llama.cpp, not Lifeline's engine: "+why
	case o.Engine == decode.EngineLifeline && goErr != nil:
		return fmt.Errorf("up: model: %w (--engine %s may serve it)", goErr, decode.EngineLlamaCpp)
	case o.Engine == decode.EngineLifeline && o.GPULayers != 0:
		return fmt.Errorf("up: gpu-layers: --engine %s computes on the CPU", decode.EngineLifeline)
	}
	if o.Engine == decode.EngineLifeline {
		return nil
	}
	if _, err := decode.CheckGGUF(o.Model); err != nil {
		if o.EngineNote != "" {
			return fmt.Errorf("up: model: neither engine serves it: Lifeline's: %v; llama.cpp: %w", goErr, err)
		}
		return fmt.Errorf("up: model: %w", err)
	}
	if !gguf.Linked && o.Binary == "" {
		if o.EngineNote != "" {
			return fmt.Errorf("up: model: Lifeline's engine does not serve it (%v), and %w", goErr, decode.ErrNoLlamaCpp)
		}
		return fmt.Errorf("up: engine: %w", decode.ErrNoLlamaCpp)
	}
	return nil
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.DataDir == "":
		return fmt.Errorf("up: data-dir: empty")
	case o.Nodes < 1 || o.Nodes > 16:
		return fmt.Errorf("up: nodes: %d (1..16)", o.Nodes)
	case o.EtcdMembers < 0 || o.EtcdMembers > 7:
		return fmt.Errorf("up: etcd-members: %d (0..7, 0 = one member inside lifeline up)", o.EtcdMembers)
	case o.ArenaMB < 0 || o.ArenaMB > MaxArenaSlots*ArenaSlotBytes>>20:
		return fmt.Errorf("up: arena-mb: %d (0..%d, 0 = sized from memory)", o.ArenaMB, MaxArenaSlots*ArenaSlotBytes>>20)
	case o.ArenaMB > 0 && o.ArenaMB<<20/ArenaSlotBytes < MinArenaSlots:
		return fmt.Errorf("up: arena-mb: %d is under %d slots of %d KiB", o.ArenaMB, MinArenaSlots, ArenaSlotBytes>>10)
	case o.Listen == "":
		return fmt.Errorf("up: listen: empty")
	case o.Prefill < 0 || o.Prefill > 16:
		return fmt.Errorf("up: prefill: %d (0..16)", o.Prefill)
	case o.TP < 0 || o.TP > 8:
		return fmt.Errorf("up: tp: %d (0..8; 0 and 1: one process per instance)", o.TP)
	case o.Frontends < 0 || o.Frontends > 16:
		return fmt.Errorf("up: frontends: %d (1..16)", o.Frontends)
	}
	return o.validateModel()
}

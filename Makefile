# Lifeline. A fresh machine needs only Go: `make run`, `make test`.
GO      ?= go
# go-nvml's headers mark deprecated calls it wraps; do not print that at
# every build. ggml (llama.cpp's kernels) picks its SIMD code when it is
# compiled: by default cgo compiles it for baseline x86-64, where its
# prompt is computed by the same kernels in any chunking, so the llama.cpp
# engine's continuation is bit-exact. CPU_ARCH=x86-64-v3 (AVX2, FMA,
# F16C) or native makes llama.cpp 2.5-8x faster (make bench, -only
# goengine) but batches go through llamafile's sgemm: a prompt computed
# in other chunks gets other logits, and the engine measures and claims
# a weaker continuation (decode/llamacpp TestDeterminism fails there).
CPU_ARCH ?=
ARCH_FLAGS := $(if $(CPU_ARCH),-march=$(CPU_ARCH),)
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations $(ARCH_FLAGS)
ifneq ($(CPU_ARCH),)
export CGO_CXXFLAGS ?= -O2 -g $(ARCH_FLAGS)
endif
BIN     ?= bin
PROMPT  ?= Once upon a time
FUZZTIME ?= 10s

.PHONY: all build build-llamacpp llamacpp-cuda run drill engine-demo test test-llamacpp test-short race bench fuzz generate lint rdma clean

all: build

build:
	$(GO) build -o $(BIN)/lifeline ./cmd/lifeline
	$(GO) build -o $(BIN)/nodectl ./cmd/nodectl

# bin/lifeline with llama.cpp linked (gcc and g++; about 4 minutes the
# first time): `engine generate --engine llamacpp` runs GGUF models.
build-llamacpp:
	CGO_ENABLED=1 $(GO) build -tags llamacpp -o $(BIN)/lifeline ./cmd/lifeline
	$(GO) build -o $(BIN)/nodectl ./cmd/nodectl

# The CUDA backend of the same llama.cpp (ggml-cuda, built by CMake from
# the ollama module's sources) into lib/lifeline: needs cmake and
# nvidia-cuda-toolkit (Debian 12 non-free: CUDA 11.8, up to sm_90; CUDA
# 12 with CUDA_PRESET="CUDA 12"). bin/lifeline from build-llamacpp loads
# it when LIFELINE_GGML_BACKENDS=$$PWD/lib/lifeline (or a worker's
# --ggml-backends) names it; instances put gpu_layers on the GPU.
CUDA_PRESET ?= CUDA 11
llamacpp-cuda: build-llamacpp
	@command -v nvcc >/dev/null || { echo "llamacpp-cuda: no nvcc: install the CUDA toolkit (Debian: nvidia-cuda-toolkit, non-free)" >&2; exit 1; }
	@command -v cmake >/dev/null || { echo "llamacpp-cuda: no cmake: install cmake" >&2; exit 1; }
	cmake -S "$$($(GO) list -m -f '{{.Dir}}' github.com/ollama/ollama)" -B build/cuda --preset "$(CUDA_PRESET)" -DCMAKE_BUILD_RPATH='$$ORIGIN'
	cmake --build build/cuda --target ggml-cuda --parallel
	mkdir -p lib/lifeline
	cp -a build/cuda/lib/ollama/libggml-base.so* build/cuda/lib/ollama/libggml-cuda.so lib/lifeline/

# The whole system on this machine: embedded etcd, two node agents with a
# decode worker each, two frontends on 127.0.0.1:8080 and :8081 (either
# resumes the other's streams). Ctrl-C stops it.
# UP_FLAGS adds flags: make run UP_FLAGS=--tls serves HTTPS and HTTP/3.
# Built first, then run as itself (not under go run, which exits 1 on
# Ctrl-C however the program ends): Ctrl-C stops everything and exits 0.
run:
	@mkdir -p bin && $(GO) build -o bin/ ./cmd/lifeline ./cmd/nodectl
	bin/lifeline up --data-dir .lifeline --nodes 2 --preset small --frontends 2 $(UP_FLAGS)

# The fault-injection drills on a local cluster, with a report
# (.lifeline-drill/report.html).
drill:
	$(GO) run ./cmd/lifeline drill all --report .lifeline-drill

# Just the reference engine: one streaming generation.
engine-demo:
	$(GO) run ./cmd/lifeline engine generate --preset small --prompt "$(PROMPT)" --seed 1 --max-tokens 64

# Unit, integration (real binaries as processes) and determinism tests.
# The binaries the process tests run are built once here and passed in
# (tests/proctest.BinariesEnv) rather than once per test package.
# The longest test packages (process tests, minutes each) are named
# first so that they start first: otherwise, last in path order, the
# longest runs alone at the end while the other core idles. The
# multi-host deployment test mostly waits (a minute at 3 % CPU): last in
# path order it ran alone at the end. tests/e2e/frontend runs 4 of its
# tests at once (its TestMain): they mostly wait. -parallel 4 for every
# package was slower (9 m 31 s against 8 m 41 s): the agent's tests,
# heavier, outgrew their share of the CPU.
LONG_FIRST = ./tests/e2e/frontend/ ./tests/e2e/agent/ ./cmd/lifeline/ ./tests/e2e/drill/ ./tests/e2e/deploy/ ./decode/worker/ ./decode/

test:
	@bin=$$(mktemp -d) && $(GO) build -o $$bin/ ./cmd/lifeline ./cmd/nodectl && \
	LIFELINE_TEST_BINARIES=$$bin $(GO) test -count=1 -timeout 14m $(LONG_FIRST) ./...; rc=$$?; rm -rf $$bin; exit $$rc

# llama.cpp (the copy in the ollama module go.mod names, compiled by cgo
# with gcc and g++, no cmake: about 4 minutes cold on 2 cores, cached
# after) and the tests of the binding (build tag llamacpp).
test-llamacpp:
	CGO_ENABLED=1 $(GO) vet -tags llamacpp ./decode/ ./decode/llamacpp/... ./decode/gguf/ ./cmd/lifeline/ ./tests/proctest/ ./tools/bench/
	CGO_ENABLED=1 $(GO) test -tags llamacpp -count=1 -timeout 20m ./decode/llamacpp/... ./decode/gguf/
	CGO_ENABLED=1 $(GO) test -tags llamacpp -count=1 -timeout 20m -run 'LlamaCpp' ./decode/ ./decode/tokenizer/
	CGO_ENABLED=1 $(GO) test -tags llamacpp -count=1 -timeout 20m -run 'LlamaCpp|GGUF' ./cmd/lifeline/

# The fast tier: everything but the process tests. The test binaries
# that take longest to link (the end-to-end packages skip every test
# here but still link, 4-8 s each) go first: last in path order, they
# were linked while the other core idled (53-55 s against 57-61 s for
# a plain go test -short ./...).
LINK_FIRST = ./tests/e2e/... ./tools/bench/ ./cmd/lifeline/ ./frontend/ ./agent/
test-short:
	$(GO) test -short -count=1 $(LINK_FIRST) ./...

# The same tests under the race detector (needs a C compiler).
race:
	CGO_ENABLED=1 $(GO) test -count=1 -race -timeout 20m ./...

# Ratios against baselines measured in the same run; see README.
bench:
	$(GO) run ./tools/bench
	if command -v g++ >/dev/null; then CGO_ENABLED=1 $(GO) run -tags llamacpp ./tools/bench -only llamacpp; \
	else echo "bench: no g++: the llama.cpp figures were not measured"; fi
	$(GO) test -run '^$$' -bench . -benchtime 1s ./decode/matmul/

# Every fuzz target, each for FUZZTIME.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzTokenizer$$' -fuzztime $(FUZZTIME) ./decode/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzReadLlama2C$$' -fuzztime $(FUZZTIME) ./decode/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzVocabEncode$$' -fuzztime $(FUZZTIME) ./decode/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzFromHFFiles$$' -fuzztime $(FUZZTIME) ./decode/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzReadLlama2C$$' -fuzztime $(FUZZTIME) ./decode/model/
	$(GO) test -run '^$$' -fuzz '^FuzzLlama2CFromBytes$$' -fuzztime $(FUZZTIME) ./decode/model/
	$(GO) test -run '^$$' -fuzz '^FuzzResumeToken$$' -fuzztime $(FUZZTIME) ./frontend/
	$(GO) test -run '^$$' -fuzz '^FuzzSSEReader$$' -fuzztime $(FUZZTIME) ./frontend/sse/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeSlotHeader$$' -fuzztime $(FUZZTIME) ./shm/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeFileHeader$$' -fuzztime $(FUZZTIME) ./shm/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeManifest$$' -fuzztime $(FUZZTIME) ./kv/
	$(GO) test -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime $(FUZZTIME) ./decode/grammar/
	$(GO) test -run '^$$' -fuzz '^FuzzAdvance$$' -fuzztime $(FUZZTIME) ./decode/grammar/
	$(GO) test -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $(FUZZTIME) ./decode/gguf/

# Regenerates committed generated code: kv/kvpb from kv.proto (needs
# protoc and protoc-gen-go: apt-get install protobuf-compiler;
# go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12).
generate:
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(GO) generate ./...

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# The RDMA verbs transport (build tag rdma) compiled against libibverbs
# (Debian: apt-get install libibverbs-dev), and the rdma package's tests on
# that build. The verbs data path cannot run without RDMA hardware; see
# README.
rdma:
	CGO_ENABLED=1 $(GO) vet -tags rdma ./rdma/
	CGO_ENABLED=1 $(GO) build -tags rdma -o /dev/null ./cmd/lifeline
	CGO_ENABLED=1 $(GO) test -tags rdma -count=1 ./rdma/

clean:
	rm -rf $(BIN) build lib

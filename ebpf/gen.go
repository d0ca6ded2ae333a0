package ebpf

// The compiled programs and their Go bindings are committed; `make
// generate` rebuilds them (Debian: apt-get install clang libbpf-dev).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type event exit exit.c -- -I/usr/include/x86_64-linux-gnu

// exit.c.sha256 records the source the committed objects were built from;
// TestGeneratedCodeIsFresh fails when exit.c changed without `make generate`.
//go:generate sh -c "sha256sum exit.c > exit.c.sha256"

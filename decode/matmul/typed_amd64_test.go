//go:build amd64 && !purego

package matmul

import "golang.org/x/sys/cpu"

func addArchSets(sets map[string]typedKernels) {
	if cpu.X86.HasAVX2 && cpu.X86.HasF16C {
		sets["avx2"] = avx2Typed
	}
	if hasAVX512 && cpu.X86.HasF16C {
		sets["avx512"] = avx512Typed
	}
}

//go:build amd64 && !purego

package matmul

import "golang.org/x/sys/cpu"

func avx2Available() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }
func wideAvailable() bool { return avx2Available() && hasAVX512 }

//go:build !amd64 || purego

package matmul

func avx2Available() bool { return false }
func wideAvailable() bool { return false }

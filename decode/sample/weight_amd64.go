//go:build amd64 && !purego

package sample

import "golang.org/x/sys/cpu"

//go:noescape
func weighAVX2(l *float64, top, temp float64, n4 uintptr)

var weighKernel = func() func(l *float64, top, temp float64, n4 uintptr) {
	if cpu.X86.HasAVX2 {
		return weighAVX2
	}
	return nil
}()

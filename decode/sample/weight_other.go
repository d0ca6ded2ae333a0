//go:build !amd64 || purego

package sample

// weighKernel: none off amd64; the portable loop gives the same bits.
var weighKernel func(l *float64, top, temp float64, n4 uintptr)

//go:build !linux

package model

import (
	"errors"
	"os"
)

// mapFile is not built here: checkpoints are read into memory.
func mapFile(*os.File, int, bool) ([]byte, error) {
	return nil, errors.New("model: mapping a checkpoint is built for linux only")
}

func unmapFile([]byte) error { return nil }

// fileIdentity is not built here: no revision is cached.
func fileIdentity(os.FileInfo) string { return "" }

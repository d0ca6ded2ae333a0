package kv

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/lifeline-llm/lifeline/shm"
)

// ServeOptions are the flags of `lifeline kv serve`, the arena owner until
// the node agent hosts it.
type ServeOptions struct {
	Arena     string
	Slots     int
	SlotBytes int
	DBDir     string
	Socket    string
	LeaseTTL  time.Duration
	HighWater float64
}

// Validate names the first bad field.
func (o *ServeOptions) Validate() error {
	switch {
	case o.Arena == "":
		return fmt.Errorf("%w: arena: empty path", ErrBadRequest)
	case o.DBDir == "":
		return fmt.Errorf("%w: db: empty path", ErrBadRequest)
	case o.Socket == "":
		return fmt.Errorf("%w: socket: empty path", ErrBadRequest)
	case o.Slots <= 0:
		return fmt.Errorf("%w: slots: %d", ErrBadRequest, o.Slots)
	case o.SlotBytes <= 0:
		return fmt.Errorf("%w: slot-bytes: %d", ErrBadRequest, o.SlotBytes)
	case o.LeaseTTL <= 0:
		return fmt.Errorf("%w: lease-ttl: %v", ErrBadRequest, o.LeaseTTL)
	}
	return nil
}

// RunServe opens the owner and serves until ctx is done. It writes one
// line to log once the socket accepts connections.
func RunServe(ctx context.Context, opts ServeOptions, log io.Writer) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	o, err := Open(Options{ArenaPath: opts.Arena, Geometry: shm.Geometry{Slots: opts.Slots, PayloadSize: opts.SlotBytes},
		DBDir: opts.DBDir, LeaseTTL: opts.LeaseTTL, HighWater: opts.HighWater})
	if err != nil {
		return err
	}
	defer o.Close()
	st := o.Stats()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, o, opts.Socket, ready) }()
	select {
	case <-ready:
		for _, q := range st.Quarantined {
			fmt.Fprintf(log, "kv: could not open %s; moved it aside and started empty\n", q)
		}
		fmt.Fprintf(log, "kv: serving %s on %s: %d slots, %d recovered, %d dropped at startup\n",
			opts.Arena, opts.Socket, st.Slots, st.RecoveredAtStart, st.DroppedAtStartup)
	case err := <-errc:
		return err
	}
	return <-errc
}

package collective

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/tests/proctest"
)

func segment(t *testing.T, tp int, gen uint64, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "group")
	if err := Create(path, tp, gen, n); err != nil {
		t.Fatal(err)
	}
	return path
}

func open(t *testing.T, path string, rank, tp int, gen uint64) *Group {
	t.Helper()
	g, err := Open(path, rank, tp, gen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// TestAllReduceIsTheRankOrderSum: 4 ranks, 200 steps of vectors of
// varying lengths: every rank ends each step with the same bits, the sum
// added in rank order 0..3.
func TestAllReduceIsTheRankOrderSum(t *testing.T) {
	const tp, steps, n = 4, 200, 1000
	path := segment(t, tp, 7, n)
	inputs := make([][][]float32, steps) // step, rank
	rng := rand.New(rand.NewPCG(1, 2))
	for s := range inputs {
		l := 1 + rng.IntN(n)
		inputs[s] = make([][]float32, tp)
		for r := range inputs[s] {
			inputs[s][r] = make([]float32, l)
			for i := range inputs[s][r] {
				inputs[s][r][i] = float32(rng.NormFloat64() * 1e3)
			}
		}
	}
	got := make([][][]float32, tp)
	var wg sync.WaitGroup
	errs := make([]error, tp)
	for r := 0; r < tp; r++ {
		g := open(t, path, r, tp, 7)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = g.Rendezvous(); errs[r] != nil {
				return
			}
			for s := 0; s < steps; s++ {
				buf := slices.Clone(inputs[s][r])
				if errs[r] = g.AllReduce(buf); errs[r] != nil {
					return
				}
				got[r] = append(got[r], buf)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for s := 0; s < steps; s++ {
		want := slices.Clone(inputs[s][0])
		for r := 1; r < tp; r++ {
			for i := range want {
				want[i] += inputs[s][r][i]
			}
		}
		for r := 0; r < tp; r++ {
			if !slices.Equal(got[r][s], want) {
				t.Fatalf("step %d rank %d: not the rank-order sum", s, r)
			}
		}
	}
}

func TestOpenRefusesAStaleGeneration(t *testing.T) {
	path := segment(t, 2, 5, 16)
	if _, err := Open(path, 1, 2, 4); !errors.Is(err, ErrStaleGeneration) {
		t.Fatalf("rank of generation 4 on a generation-5 segment: %v", err)
	}
	if _, err := Open(path, 1, 4, 5); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("tp 4 rank on a tp-2 segment: %v", err)
	}
	if _, err := Open(path, 2, 2, 5); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("rank 2 of 2: %v", err)
	}
	other := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(other, make([]byte, 4096), 0o600)
	if _, err := Open(other, 0, 2, 5); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("a file of zeros: %v", err)
	}
	g := open(t, path, 0, 2, 5)
	if err := g.AllReduce(make([]float32, 17)); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("an all-reduce larger than the segment: %v", err)
	}
}

// TestAbortEndsWaitsAtOnce: 3 of 4 ranks wait in an all-reduce for a rank
// that never comes; the segment is aborted from outside (the agent): all
// three return ErrAborted within 50 ms, and so does every later one.
func TestAbortEndsWaitsAtOnce(t *testing.T) {
	path := segment(t, 4, 1, 64)
	done := make(chan error, 3)
	for r := 0; r < 3; r++ {
		g := open(t, path, r, 4, 1)
		go func() { done <- g.AllReduce(make([]float32, 64)) }()
	}
	time.Sleep(50 * time.Millisecond) // parked on the futex by now
	at := time.Now()
	if err := AbortSegment(path); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := <-done; !errors.Is(err, ErrAborted) {
			t.Fatalf("a waiting rank returned %v", err)
		}
	}
	if d := time.Since(at); d > 50*time.Millisecond {
		t.Fatalf("the waiting ranks returned %v after the abort", d)
	}
	g := open(t, path, 3, 4, 1)
	if err := g.AllReduce(make([]float32, 8)); !errors.Is(err, ErrAborted) {
		t.Fatalf("an all-reduce after the abort: %v", err)
	}
	if err := g.Rendezvous(); !errors.Is(err, ErrAborted) {
		t.Fatalf("a rendezvous after the abort: %v", err)
	}
}

// TestWatchAbort: a watch parked on the abort word hears an abort made
// through another mapping at once, and a watch of a group nobody aborts
// stops at once.
func TestWatchAbort(t *testing.T) {
	path := segment(t, 2, 1, 64)
	g := open(t, path, 0, 2, 1)
	for i := 0; i < 20; i++ {
		aborted, stop := g.WatchAbort()
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // parked by now, most likely
		}
		at := time.Now()
		stop()
		if d := time.Since(at); d > 100*time.Millisecond {
			t.Fatalf("stop took %v", d)
		}
		select {
		case <-aborted:
			t.Fatal("the watch said aborted; nobody aborted")
		default:
		}
	}
	aborted, stop := g.WatchAbort()
	defer stop()
	time.Sleep(20 * time.Millisecond)
	at := time.Now()
	if err := AbortSegment(path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-aborted:
		if d := time.Since(at); d > 50*time.Millisecond {
			t.Fatalf("the watch heard the abort after %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch never heard the abort")
	}
}

func TestMissingRankTimesOut(t *testing.T) {
	path := segment(t, 2, 1, 8)
	g := open(t, path, 0, 2, 1)
	g.Timeout = 100 * time.Millisecond
	at := time.Now()
	if err := g.AllReduce(make([]float32, 8)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("alone in a group of 2: %v", err)
	}
	if d := time.Since(at); d < 100*time.Millisecond || d > time.Second {
		t.Fatalf("timed out after %v, bound 100 ms", d)
	}
	if err := g.Rendezvous(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("rendezvous alone: %v", err)
	}
}

// rankMain is a rank process (this test binary re-executed): it
// all-reduces forever until the group is aborted, then exits 3.
func rankMain(path string, rank, tp int) {
	g, err := Open(path, rank, tp, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	buf := make([]float32, 4096)
	for {
		for i := range buf {
			buf[i] = float32(rank)
		}
		if err := g.AllReduce(buf); err != nil {
			if errors.Is(err, ErrAborted) {
				os.Exit(3)
			}
			fmt.Fprintln(os.Stderr, err)
			os.Exit(4)
		}
	}
}

func TestMain(m *testing.M) {
	if path := os.Getenv("COLLECTIVE_RANK_SEGMENT"); path != "" {
		rank, _ := strconv.Atoi(os.Getenv("COLLECTIVE_RANK"))
		tp, _ := strconv.Atoi(os.Getenv("COLLECTIVE_TP"))
		rankMain(path, rank, tp)
	}
	os.Exit(m.Run())
}

// TestRankDeathAbortsTheGroup: 4 rank processes all-reducing in a loop;
// one is SIGKILLed, and what its parent sees of the death (the wait
// returning: the agent's exit event) aborts the segment. Every survivor
// exits with "aborted" within 50 ms of the death being seen. Five times.
func TestRankDeathAbortsTheGroup(t *testing.T) {
	proctest.Processes(t)
	const tp = 4
	var worst time.Duration
	for round := 0; round < 5; round++ {
		path := segment(t, tp, 1, 4096)
		cmds := make([]*exec.Cmd, tp)
		exited := make([]chan time.Time, tp)
		for r := range cmds {
			cmds[r] = exec.Command(os.Args[0], "-test.run=^$")
			cmds[r].Env = append(os.Environ(), "COLLECTIVE_RANK_SEGMENT="+path, fmt.Sprint("COLLECTIVE_RANK=", r), fmt.Sprint("COLLECTIVE_TP=", tp))
			cmds[r].Stderr = os.Stderr
			if err := cmds[r].Start(); err != nil {
				t.Fatal(err)
			}
			exited[r] = make(chan time.Time, 1)
			go func() { cmds[r].Wait(); exited[r] <- time.Now() }()
		}
		time.Sleep(200 * time.Millisecond) // all-reducing by now
		victim := round % tp
		cmds[victim].Process.Signal(syscall.SIGKILL)
		seen := <-exited[victim]
		if err := AbortSegment(path); err != nil {
			t.Fatal(err)
		}
		for r := range cmds {
			if r == victim {
				continue
			}
			select {
			case at := <-exited[r]:
				if code := cmds[r].ProcessState.ExitCode(); code != 3 {
					t.Fatalf("round %d: rank %d exited %d, want 3 (aborted)", round, r, code)
				}
				worst = max(worst, at.Sub(seen))
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: rank %d still running 5 s after rank %d died", round, r, victim)
			}
		}
	}
	t.Logf("survivors exited at most %v after the death was seen", worst)
	if worst > 50*time.Millisecond {
		t.Fatalf("a survivor exited %v after the death, bound 50 ms", worst)
	}
}

// TestBroadcastInterleavesWithAllReduce: rank 0's messages reach both
// followers byte for byte, steps of broadcasts and all-reduces
// interleaved; an idle wait for the next broadcast outlasts Timeout and
// ends at once on an abort.
func TestBroadcastInterleavesWithAllReduce(t *testing.T) {
	const tp = 3
	path := segment(t, tp, 2, 256)
	rng := rand.New(rand.NewPCG(3, 4))
	msgs := make([][]byte, 50)
	for i := range msgs {
		msgs[i] = make([]byte, rng.IntN(1000))
		for j := range msgs[i] {
			msgs[i][j] = byte(rng.Uint32())
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, tp)
	for r := 0; r < tp; r++ {
		g := open(t, path, r, tp, 2)
		g.Timeout = 200 * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, m := range msgs {
				var in []byte
				if r == 0 {
					in = m
				}
				got, err := g.Broadcast(in, false)
				if err == nil && string(got) != string(m) {
					err = fmt.Errorf("message %d: %d bytes, want %d", i, len(got), len(m))
				}
				if err == nil {
					err = g.AllReduce(make([]float32, 256))
				}
				if err != nil {
					errs[r] = err
					return
				}
			}
			if r == 0 {
				return
			}
			// Idle: rank 0 sends nothing more; the wait outlasts Timeout
			// and ends with the abort.
			_, errs[r] = g.Broadcast(nil, true)
		}()
	}
	time.Sleep(500 * time.Millisecond) // more than Timeout
	if err := AbortSegment(path); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if errs[0] != nil {
		t.Fatalf("rank 0: %v", errs[0])
	}
	for r := 1; r < tp; r++ {
		if !errors.Is(errs[r], ErrAborted) {
			t.Fatalf("rank %d: %v, want the idle wait ended by the abort", r, errs[r])
		}
	}
	g := open(t, path, 0, tp, 2)
	if _, err := g.Broadcast(make([]byte, 4*256), false); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("a broadcast larger than the segment: %v", err)
	}
}

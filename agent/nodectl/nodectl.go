// Package nodectl is the operator CLI of a node: it talks to the agent's
// control socket (HTTP over a unix socket, JSON).
package nodectl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// DefaultSocket is where the systemd unit puts the control socket.
const DefaultSocket = "/run/lifeline/agent.sock"

// client is a one-request client of the agent's socket: its connection
// closes with the answer (a transport per call that kept it alive would
// leave an idle connection, and its goroutines, on both ends per call).
func client(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func get(ctx context.Context, socket, path string) (*http.Response, error) {
	return do(ctx, socket, http.MethodGet, path, nil)
}

// do sends one request to the agent. An error answer comes back as the
// agent's typed *controlapi.Error where the body is one.
func do(ctx context.Context, socket, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client(socket).Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent at %s: %w", socket, err)
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e controlapi.Error
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return nil, &e
		}
		return nil, fmt.Errorf("agent: %s: %s", resp.Status, b)
	}
	return resp, nil
}

// postJSON posts in (nil: no body) and decodes the answer into out.
func postJSON(ctx context.Context, socket, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := do(ctx, socket, http.MethodPost, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// Reset makes an instance in crash_loop try again at once. It fails with
// controlapi.ErrUnknownInstance or controlapi.ErrNotInCrashLoop.
func Reset(ctx context.Context, socket, instance string) (controlapi.Worker, error) {
	var w controlapi.Worker
	err := postJSON(ctx, socket, "/v1/instances/"+url.PathEscape(instance)+"/reset", nil, &w)
	return w, err
}

func getJSON(ctx context.Context, socket, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := get(ctx, socket, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// Workers asks the agent at socket for its supervised workers.
func Workers(ctx context.Context, socket string) ([]controlapi.Worker, error) {
	var ws []controlapi.Worker
	err := getJSON(ctx, socket, "/v1/workers", &ws)
	return ws, err
}

// Command is the nodectl root command.
func Command() *cobra.Command {
	var socket string
	root := &cobra.Command{Use: "nodectl", Short: "Inspect and drain a Lifeline node", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().StringVar(&socket, "socket", DefaultSocket, "the agent's control socket")
	root.AddCommand(statusCmd(&socket), workersCmd(&socket), eventsCmd(&socket), kvCmd(&socket), resetCmd(&socket), drainCmd(&socket), undrainCmd(&socket))
	return root
}

// statusCmd is `nodectl status`.
func statusCmd(socket *string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{Use: "status", Short: "Detectors, etcd, lease, arena and instances", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st controlapi.Status
			if err := getJSON(cmd.Context(), *socket, "/v1/status", &st); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(st)
			}
			if err := printStatus(cmd.OutOrStdout(), st); err != nil {
				return err
			}
			ms, err := EtcdMembers(cmd.Context(), *socket)
			printEtcdMembers(cmd.OutOrStdout(), ms, err)
			return nil
		}}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(out io.Writer, st controlapi.Status) error {
	fmt.Fprintf(out, "node %s, up %.0fs\n", st.NodeID, st.UptimeSeconds)
	fmt.Fprintf(out, "failure detector: %s", st.Detector)
	if st.DetectorFallback != "" {
		fmt.Fprintf(out, " (eBPF unavailable: %s)", st.DetectorFallback)
	}
	fmt.Fprintf(out, "\nGPU: %s", st.GPU)
	fmt.Fprintf(out, "\netcd %v: lease %x, routable %v, last renewal %dms ago\n", st.Etcd.Endpoints, st.Etcd.LeaseID, st.Etcd.Routable, st.Etcd.LastRenewalMs)
	fmt.Fprintf(out, "arena: %v of %v slots in use %v\n", st.Arena["slots_in_use"], st.Arena["slots"], st.Arena["by_state"])
	if st.Drain != nil {
		printDrain(out, *st.Drain)
	}
	kt := st.KVTransfer
	fmt.Fprintf(out, "KV transfer: %s at %s (%s); pulled %d blocks / %d bytes, served %d, stale dropped %d\n",
		kt.Transport, kt.Addr, kt.Reason, kt.Stats.BlocksPulled, kt.Stats.BytesPulled, kt.Stats.BlocksServed, kt.Stats.StaleDropped)
	return printWorkers(out, st.Instances)
}

// workersCmd is `nodectl workers`.
func workersCmd(socket *string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{Use: "workers", Short: "Supervised worker processes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := Workers(cmd.Context(), *socket)
			if err != nil {
				return err
			}
			if asJSON {
				if ws == nil {
					ws = []controlapi.Worker{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(ws)
			}
			return printWorkers(cmd.OutOrStdout(), ws)
		}}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print a JSON array of {"instance_id","role","rank","pid","generation","ready","last_exit"}`)
	return cmd
}

// resetCmd is `nodectl reset`.
func resetCmd(socket *string) *cobra.Command {
	var instance string
	cmd := &cobra.Command{Use: "reset --instance ID", Short: "Try an instance in crash_loop again at once", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := Reset(cmd.Context(), *socket, instance)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: out of crash_loop, starting again\n", w.InstanceID)
			return nil
		}}
	cmd.Flags().StringVar(&instance, "instance", "", "the instance id (nodectl workers)")
	cmd.MarkFlagRequired("instance")
	return cmd
}

// eventsCmd is `nodectl events`.
func eventsCmd(socket *string) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{Use: "events", Short: "Recent events as JSON lines", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/v1/events"
			if follow {
				path += "?follow=1"
			}
			resp, err := get(cmd.Context(), *socket, path)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				fmt.Fprintln(cmd.OutOrStdout(), sc.Text())
			}
			if cmd.Context().Err() != nil {
				return nil
			}
			return sc.Err()
		}}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events")
	return cmd
}

// kvCmd is `nodectl kv` and its subcommands.
func kvCmd(socket *string) *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "The node's KV arena"}
	cmd.AddCommand(kvStatsCmd(socket), kvLsCmd(socket))
	return cmd
}

// kvStatsCmd is `nodectl kv stats`.
func kvStatsCmd(socket *string) *cobra.Command {
	return &cobra.Command{Use: "stats", Short: "Slots by state and counters (JSON)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var v map[string]any
			if err := getJSON(cmd.Context(), *socket, "/v1/kv/stats", &v); err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(v)
		}}
}

// kvLsCmd is `nodectl kv ls`.
func kvLsCmd(socket *string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{Use: "ls", Short: "Slots that are not free: state, generation, key, writer, leases", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var slots []controlapi.Slot
			if err := getJSON(cmd.Context(), *socket, "/v1/kv/ls", &slots); err != nil {
				return err
			}
			if asJSON {
				if slots == nil {
					slots = []controlapi.Slot{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(slots)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SLOT\tGEN\tSTATE\tKEY\tWRITER\tBYTES\tLEASES")
			for _, s := range slots {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%d\n", s.Slot, s.Generation, s.State, s.Key, s.Writer, s.PayloadLen, s.Leases)
			}
			return tw.Flush()
		}}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func printWorkers(out io.Writer, ws []controlapi.Worker) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tROLE\tGEN\tPID\tREADY\tSTATE\tRESTARTS\tLAST EXIT")
	for _, w := range ws {
		last := "-"
		if w.LastExit != nil {
			last = fmt.Sprintf("%s (%s)", w.LastExit.Reason, w.LastExit.Detector)
		}
		ready := fmt.Sprint(w.Ready)
		if !w.Ready && w.NotReady != "" {
			ready = "no: " + w.NotReady
		}
		state := w.State
		if !w.NextAttempt.IsZero() {
			state += fmt.Sprintf(" (next attempt %s, in %v)", w.NextAttempt.Format(time.TimeOnly), time.Until(w.NextAttempt).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", w.InstanceID, w.Role, w.Generation, w.PID, ready, state, w.Restarts, last)
		for _, r := range w.Ranks {
			fmt.Fprintf(tw, "  rank %d/%d\t\t%d\t%d\t\t\t\t\n", r.Rank, w.TP, w.Generation, r.PID)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range ws {
		if w.StartError != "" {
			fmt.Fprintf(out, "%s cannot start: %s\n", w.InstanceID, w.StartError)
		}
	}
	return nil
}

// EtcdMembers asks the agent at socket for etcd's members and their
// health.
func EtcdMembers(ctx context.Context, socket string) ([]controlapi.EtcdMember, error) {
	var ms []controlapi.EtcdMember
	err := getJSON(ctx, socket, "/v1/etcd/members", &ms)
	return ms, err
}

// printEtcdMembers prints etcd's members: healthy ones, the leader, and
// what the others answered.
func printEtcdMembers(out io.Writer, ms []controlapi.EtcdMember, err error) {
	if err != nil {
		fmt.Fprintf(out, "\netcd members: %v\n", err)
		return
	}
	healthy := 0
	for _, m := range ms {
		if m.Healthy {
			healthy++
		}
	}
	fmt.Fprintf(out, "\netcd members: %d of %d healthy (a quorum needs %d)\n", healthy, len(ms), len(ms)/2+1)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tID\tSTATE\tDB\tRAFT INDEX\tCLIENT URLS")
	for _, m := range ms {
		state := "healthy"
		switch {
		case m.Error != "":
			state = "unhealthy: " + m.Error
		case len(m.Errors) > 0:
			state = "unhealthy: " + strings.Join(m.Errors, "; ")
		case m.Leader:
			state = "healthy, leader"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", m.Name, m.ID, state, mb(m.DBSize), m.RaftIndex, strings.Join(m.ClientURLs, ","))
	}
	tw.Flush()
}

// mb is n bytes in MiB ("" for 0).
func mb(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// GetStatus asks the agent at socket for its status.
func GetStatus(ctx context.Context, socket string) (controlapi.Status, error) {
	var st controlapi.Status
	err := getJSON(ctx, socket, "/v1/status", &st)
	return st, err
}

// Events asks the agent at socket for its recent events, oldest first.
func Events(ctx context.Context, socket string) ([]controlapi.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := get(ctx, socket, "/v1/events")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var evs []controlapi.Event
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var e controlapi.Event
		if err := dec.Decode(&e); err != nil {
			return evs, fmt.Errorf("agent at %s: events: %w", socket, err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

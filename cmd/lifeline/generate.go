package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/frontend/client"
)

func clientGenerateCmd() *cobra.Command {
	var (
		url    string
		req    client.Request
		temp   float64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "generate PROMPT",
		Short: "Stream a completion from a Lifeline frontend, resuming by itself if the connection breaks",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Prompt = strings.Join(args, " ")
			req.Temperature = &temp
			out := cmd.OutOrStdout()
			enc := json.NewEncoder(out)
			_, err := client.New(url).Stream(cmd.Context(), req, func(t client.Token) {
				if asJSON {
					enc.Encode(map[string]any{"sequence_no": t.SequenceNo, "token_id": t.TokenID, "text": t.Text})
					return
				}
				fmt.Fprint(out, t.Text)
			})
			if err != nil {
				return err
			}
			if !asJSON {
				fmt.Fprintln(out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:8080", "frontend URL")
	f.StringVar(&req.Model, "model", "small", "model")
	f.IntVar(&req.MaxTokens, "max-tokens", 64, "tokens to generate")
	f.Uint64Var(&req.Seed, "seed", 0, "sampling seed")
	f.Float64Var(&temp, "temperature", 0.8, "sampling temperature")
	f.BoolVar(&req.IgnoreEOS, "ignore-eos", false, "keep generating past end-of-sequence")
	f.BoolVar(&asJSON, "json", false, "one JSON object per token")
	return cmd
}

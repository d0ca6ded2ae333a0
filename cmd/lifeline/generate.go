package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

func clientGenerateCmd() *cobra.Command {
	var (
		urls    []string
		req     client.Request
		temp    float64
		asJSON  bool
		h3      bool
		certDir string
		server  string
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
			opts := client.Options{H3: h3}
			if certDir != "" || server != "" {
				cfg, err := generateTLS(certDir, server)
				if err != nil {
					return err
				}
				opts.TLS = cfg
			}
			c := client.NewWith(opts, urls...)
			defer c.Close()
			_, err := c.Stream(cmd.Context(), req, func(t client.Token) {
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
	f.StringArrayVar(&urls, "url", []string{"http://127.0.0.1:8080"}, "frontend URL (repeat for several frontends: a broken stream resumes on the next)")
	f.BoolVar(&h3, "h3", false, "speak HTTP/3 from the first request (https URLs); without it the client switches when a frontend advertises HTTP/3")
	f.StringVar(&certDir, "cert-dir", "", "trust the cluster CA in this certificate directory for https URLs")
	f.StringVar(&server, "server-name", "", "TLS server name to verify (default: the URL's host)")
	f.StringVar(&req.Model, "model", "small", "model")
	f.IntVar(&req.MaxTokens, "max-tokens", 64, "tokens to generate")
	f.Uint64Var(&req.Seed, "seed", 0, "sampling seed")
	f.Float64Var(&temp, "temperature", 0.8, "sampling temperature")
	f.BoolVar(&req.IgnoreEOS, "ignore-eos", false, "keep generating past end-of-sequence")
	f.BoolVar(&asJSON, "json", false, "one JSON object per token")
	return cmd
}

// generateTLS trusts the cluster CA of certDir, if given, and
// verifies serverName, if given.
func generateTLS(certDir, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName}
	if certDir != "" {
		pem, err := os.ReadFile(filepath.Join(certDir, pki.CAFile))
		if err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("generate: no certificate in %s", filepath.Join(certDir, pki.CAFile))
		}
	}
	return cfg, nil
}

package schema

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ResumeKeysKey holds the cluster's resume-token key ring (a
// ResumeKeyRing): every frontend signs with its first key and accepts
// tokens of any key in it, so any frontend resumes any stream.
const ResumeKeysKey = "/lifeline/v1/resume/keys"

// ResumeKey is one key of the ring.
type ResumeKey struct {
	ID              string `json:"id"`
	Secret          []byte `json:"secret"`
	CreatedUnixNano int64  `json:"created_unix_nano"`
}

// ResumeKeyRing is the value of ResumeKeysKey: at most MaxResumeKeys
// keys, the current one first. A rotation puts a new key first and keeps
// the previous one second, so tokens it signed stay valid until the next
// rotation.
type ResumeKeyRing struct {
	Keys []ResumeKey `json:"keys"`
}

// MaxResumeKeys bounds the ring.
const MaxResumeKeys = 2

// ErrBadRecord is wrapped by every refusal of a malformed record read
// from etcd.
var ErrBadRecord = errors.New("schema: bad record")

// DecodeResumeKeyRing parses and checks a ring.
func DecodeResumeKeyRing(b []byte) (ResumeKeyRing, error) {
	var r ResumeKeyRing
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: resume key ring: %v", ErrBadRecord, err)
	}
	if len(r.Keys) == 0 || len(r.Keys) > MaxResumeKeys {
		return r, fmt.Errorf("%w: resume key ring: %d keys (1..%d)", ErrBadRecord, len(r.Keys), MaxResumeKeys)
	}
	for i, k := range r.Keys {
		if k.ID == "" || len(k.ID) > 64 || len(k.Secret) < 16 {
			return r, fmt.Errorf("%w: resume key ring: key %d: id %q, %d secret bytes (want an id of 1..64 bytes, 16+ bytes)", ErrBadRecord, i, k.ID, len(k.Secret))
		}
	}
	return r, nil
}

// RequestsPrefix holds one RequestRecord per streamed request
// (RequestsPrefix+id), under a lease of its owner frontend that outlives
// the resume window: any frontend resumes (takes over, or replays) a
// stream from it.
const RequestsPrefix = "/lifeline/v1/requests/"

// RequestRecord is the value of a request key. The owner writes it at
// admission (Term 1), a frontend that takes the request over rewrites it
// with itself as owner at Term+1 in a transaction on the read
// ModRevision, and the owner writes it once more when the request ends
// (Done, with its output).
type RequestRecord struct {
	ID string `json:"id"`
	// Body is the completion request as admitted (JSON): prompt, model,
	// sampling parameters and seed, max_tokens, stop.
	Body      json.RawMessage `json:"body"`
	Chat      bool            `json:"chat,omitempty"`
	Resumable bool            `json:"resumable,omitempty"`
	// DeadlineUnixNano is the request's deadline (0: none);
	// ResumeExpiryUnixNano is when it stops being resumable.
	DeadlineUnixNano     int64 `json:"deadline_unix_nano,omitempty"`
	ResumeExpiryUnixNano int64 `json:"resume_expiry_unix_nano"`
	AdmittedUnixNano     int64 `json:"admitted_unix_nano"`
	// Owner is the FrontendRecord id of the frontend driving the request,
	// OwnerURL where its clients reach it, Term how many owners it has had.
	Owner    string `json:"owner"`
	OwnerURL string `json:"owner_url"`
	Term     uint64 `json:"term"`

	// Prefix is the output delivered before the request's last
	// migration (written when the continuation starts): a frontend that
	// takes the request over has it from here and attaches to the
	// continuation on its worker from the sequence after it.
	Prefix []RecordToken `json:"prefix,omitempty"`

	Done         bool   `json:"done,omitempty"`
	FinishReason string `json:"finish_reason,omitempty"`
	ErrorType    string `json:"error_type,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	// Output is every token of a done request; End the summary (the
	// lifeline object) of its final chunk.
	Output []RecordToken    `json:"output,omitempty"`
	End    *json.RawMessage `json:"end,omitempty"`
	// LogprobsOmitted: the output's logprobs did not fit the record's
	// size bound and were left out; a replay has none.
	LogprobsOmitted bool `json:"logprobs_omitted,omitempty"`
	// PromptTokens is a done request's prompt length in its model's
	// tokens (0: not known), for the usage of a replay.
	PromptTokens int `json:"prompt_tokens,omitempty"`
}

// RecordToken is one output token of a done request.
type RecordToken struct {
	ID   int    `json:"id"`
	Text string `json:"text"`
	// Logprobs are the token's log-probabilities as the frontend keeps
	// them (absent unless the request asked for them), so a replay of a
	// done request carries them unchanged.
	Logprobs json.RawMessage `json:"logprobs,omitempty"`
}

// MaxRecordTerm bounds a record's term: request epochs carry the term in
// their upper 32 bits.
const MaxRecordTerm = 1<<31 - 1

// DecodeRequestRecord parses and checks a record stored at key.
func DecodeRequestRecord(key string, b []byte) (RequestRecord, error) {
	var r RequestRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: %s: %v", ErrBadRecord, key, err)
	}
	switch {
	case RequestsPrefix+r.ID != key:
		return r, fmt.Errorf("%w: %s: id %q", ErrBadRecord, key, r.ID)
	case len(r.Body) == 0:
		return r, fmt.Errorf("%w: %s: no body", ErrBadRecord, key)
	case r.Owner == "" || r.Term < 1 || r.Term > MaxRecordTerm:
		return r, fmt.Errorf("%w: %s: owner %q at term %d", ErrBadRecord, key, r.Owner, r.Term)
	case r.Done && r.FinishReason == "" && r.ErrorType == "":
		return r, fmt.Errorf("%w: %s: done without a finish reason or an error", ErrBadRecord, key)
	}
	return r, nil
}

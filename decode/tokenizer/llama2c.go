package tokenizer

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"unicode/utf8"
)

// ErrBadTokenizerFile is wrapped by every error about a malformed
// tokenizer.bin.
var ErrBadTokenizerFile = errors.New("tokenizer: malformed tokenizer.bin")

// Llama2C is the SentencePiece-derived BPE vocabulary of llama2.c's
// tokenizer.bin: pieces with merge scores, "<0xXX>" byte fallback at ids
// 3..258, and a leading space on word-initial pieces.
type Llama2C struct {
	pieces   [][]byte
	scores   []float32
	ids      map[string]int
	maxLen   int
	hash     string
	byteID   [256]int
	spaceID  int
	byteByID map[int]byte
}

// maxPieceLen bounds a single piece; llama2.c vocabularies stay far below.
const maxPieceLen = 1 << 10

// ReadLlama2C reads a tokenizer.bin with vocabSize entries (the vocabulary
// size comes from the model header, as in llama2.c).
func ReadLlama2C(r io.Reader, vocabSize int) (*Llama2C, error) {
	if vocabSize < ByteBase+256 || vocabSize > 1<<22 {
		return nil, fmt.Errorf("%w: vocabulary size %d (need %d..%d)", ErrBadTokenizerFile, vocabSize, ByteBase+256, 1<<22)
	}
	br := bufio.NewReader(r)
	var maxLen int32
	if err := binary.Read(br, binary.LittleEndian, &maxLen); err != nil {
		return nil, fmt.Errorf("%w: max token length: %v", ErrBadTokenizerFile, err)
	}
	if maxLen <= 0 || maxLen > maxPieceLen {
		return nil, fmt.Errorf("%w: max token length %d", ErrBadTokenizerFile, maxLen)
	}
	t := &Llama2C{ids: make(map[string]int, min(vocabSize, 1<<16)), byteByID: make(map[int]byte), spaceID: -1}
	for i := range t.byteID {
		t.byteID[i] = -1
	}
	for i := 0; i < vocabSize; i++ {
		var raw [8]byte // score float32, length int32
		if _, err := io.ReadFull(br, raw[:]); err != nil {
			return nil, fmt.Errorf("%w: entry %d: %v", ErrBadTokenizerFile, i, err)
		}
		hdr := struct {
			Score float32
			Len   int32
		}{math.Float32frombits(binary.LittleEndian.Uint32(raw[:4])), int32(binary.LittleEndian.Uint32(raw[4:]))}
		if hdr.Len < 0 || hdr.Len > maxLen || math.IsNaN(float64(hdr.Score)) {
			return nil, fmt.Errorf("%w: entry %d: length %d, score %v", ErrBadTokenizerFile, i, hdr.Len, hdr.Score)
		}
		p := make([]byte, hdr.Len)
		if _, err := io.ReadFull(br, p); err != nil {
			return nil, fmt.Errorf("%w: entry %d: %v", ErrBadTokenizerFile, i, err)
		}
		t.pieces = append(t.pieces, p)
		t.scores = append(t.scores, hdr.Score)
		if _, dup := t.ids[string(p)]; !dup {
			t.ids[string(p)] = i
		}
		t.maxLen = max(t.maxLen, len(p))
		var b byte
		// Sscanf only where it can match: it costs microseconds a piece.
		if len(p) == 6 && string(p[:3]) == "<0x" {
			if n, _ := fmt.Sscanf(string(p), "<0x%02X>", &b); n == 1 {
				t.byteByID[i] = b
				if t.byteID[b] < 0 {
					t.byteID[b] = i
				}
			}
		}
	}
	if id, ok := t.ids[" "]; ok {
		t.spaceID = id
	}
	h := sha256.New()
	h.Write([]byte("llama2c-bpe/v1\x00"))
	for i, p := range t.pieces {
		binary.Write(h, binary.LittleEndian, t.scores[i])
		h.Write(p)
		h.Write([]byte{0})
	}
	t.hash = hex.EncodeToString(h.Sum(nil))
	return t, nil
}

// WriteLlama2C writes pieces and scores in tokenizer.bin format.
func WriteLlama2C(w io.Writer, pieces []string, scores []float32) error {
	if len(pieces) != len(scores) {
		return fmt.Errorf("tokenizer: %d pieces but %d scores", len(pieces), len(scores))
	}
	maxLen := 0
	for _, p := range pieces {
		maxLen = max(maxLen, len(p))
	}
	bw := bufio.NewWriter(w)
	binary.Write(bw, binary.LittleEndian, int32(maxLen))
	for i, p := range pieces {
		binary.Write(bw, binary.LittleEndian, scores[i])
		binary.Write(bw, binary.LittleEndian, int32(len(p)))
		bw.WriteString(p)
	}
	return bw.Flush()
}

func (t *Llama2C) VocabSize() int { return len(t.pieces) }
func (t *Llama2C) BOS() int       { return BOSID }
func (t *Llama2C) EOS() int       { return EOSID }
func (t *Llama2C) Hash() string   { return t.hash }

func (t *Llama2C) Piece(prev, id int) []byte {
	if id < 0 || id >= len(t.pieces) || id < ByteBase {
		return nil
	}
	if b, ok := t.byteByID[id]; ok {
		return []byte{b}
	}
	p := t.pieces[id]
	// SentencePiece puts a space before the first word; llama2.c drops it
	// right after BOS.
	if prev == BOSID && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	return p
}

// Encode follows llama2.c: a dummy-prefix space, one piece per code point
// (byte fallback otherwise), then repeatedly merge the adjacent pair whose
// concatenation is the best-scored piece.
func (t *Llama2C) Encode(text string) ([]int, error) {
	if !utf8.ValidString(text) {
		return nil, ErrInvalidUTF8
	}
	var ids []int
	if text != "" && t.spaceID >= 0 {
		ids = append(ids, t.spaceID)
	}
	for i := 0; i < len(text); {
		_, size := utf8.DecodeRuneInString(text[i:])
		if id, ok := t.ids[text[i:i+size]]; ok {
			ids = append(ids, id)
		} else {
			for k := 0; k < size; k++ {
				id := t.byteID[text[i+k]]
				if id < 0 {
					id = UnkID
				}
				ids = append(ids, id)
			}
		}
		i += size
	}
	buf := make([]byte, 0, 2*t.maxLen)
	for {
		best, bestID, bestScore := -1, -1, float32(math.Inf(-1))
		for i := 0; i+1 < len(ids); i++ {
			buf = append(append(buf[:0], t.pieces[ids[i]]...), t.pieces[ids[i+1]]...)
			if id, ok := t.ids[string(buf)]; ok && t.scores[id] > bestScore {
				best, bestID, bestScore = i, id, t.scores[id]
			}
		}
		if best < 0 {
			return ids, nil
		}
		ids[best] = bestID
		ids = append(ids[:best+1], ids[best+2:]...)
	}
}

package gguf

import "fmt"

// TensorType is a tensor's element encoding (ggml_type).
type TensorType uint32

// The tensor types of GGUF files llama.cpp reads (ggml.h's ggml_type;
// the numbers are the file format's).
const (
	F32     TensorType = 0
	F16     TensorType = 1
	Q4_0    TensorType = 2
	Q4_1    TensorType = 3
	Q5_0    TensorType = 6
	Q5_1    TensorType = 7
	Q8_0    TensorType = 8
	Q8_1    TensorType = 9
	Q2_K    TensorType = 10
	Q3_K    TensorType = 11
	Q4_K    TensorType = 12
	Q5_K    TensorType = 13
	Q6_K    TensorType = 14
	Q8_K    TensorType = 15
	IQ2_XXS TensorType = 16
	IQ2_XS  TensorType = 17
	IQ3_XXS TensorType = 18
	IQ1_S   TensorType = 19
	IQ4_NL  TensorType = 20
	IQ3_S   TensorType = 21
	IQ2_S   TensorType = 22
	IQ4_XS  TensorType = 23
	I8      TensorType = 24
	I16     TensorType = 25
	I32     TensorType = 26
	I64     TensorType = 27
	F64     TensorType = 28
	IQ1_M   TensorType = 29
	BF16    TensorType = 30
	TQ1_0   TensorType = 34
	TQ2_0   TensorType = 35
	MXFP4   TensorType = 39
)

// typeInfo is a type's name, elements per block and bytes per block.
type typeInfo struct {
	name        string
	block, size int
}

// types are ggml's type traits for every type a file may hold (a test
// built with llama.cpp checks them against ggml_blck_size and
// ggml_type_size).
var types = map[TensorType]typeInfo{
	F32: {"F32", 1, 4}, F16: {"F16", 1, 2}, BF16: {"BF16", 1, 2}, F64: {"F64", 1, 8},
	I8: {"I8", 1, 1}, I16: {"I16", 1, 2}, I32: {"I32", 1, 4}, I64: {"I64", 1, 8},
	Q4_0: {"Q4_0", 32, 18}, Q4_1: {"Q4_1", 32, 20}, Q5_0: {"Q5_0", 32, 22}, Q5_1: {"Q5_1", 32, 24},
	Q8_0: {"Q8_0", 32, 34}, Q8_1: {"Q8_1", 32, 36}, MXFP4: {"MXFP4", 32, 17}, IQ4_NL: {"IQ4_NL", 32, 18},
	Q2_K: {"Q2_K", 256, 84}, Q3_K: {"Q3_K", 256, 110}, Q4_K: {"Q4_K", 256, 144}, Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210}, Q8_K: {"Q8_K", 256, 292},
	IQ2_XXS: {"IQ2_XXS", 256, 66}, IQ2_XS: {"IQ2_XS", 256, 74}, IQ3_XXS: {"IQ3_XXS", 256, 98}, IQ1_S: {"IQ1_S", 256, 50},
	IQ3_S: {"IQ3_S", 256, 110}, IQ2_S: {"IQ2_S", 256, 82}, IQ4_XS: {"IQ4_XS", 256, 136}, IQ1_M: {"IQ1_M", 256, 56},
	TQ1_0: {"TQ1_0", 256, 54}, TQ2_0: {"TQ2_0", 256, 66},
}

func (t TensorType) info() (typeInfo, bool) {
	i, ok := types[t]
	return i, ok
}

func (t TensorType) String() string {
	if i, ok := types[t]; ok {
		return i.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Block is how many elements one block of t holds; BlockBytes its size
// in bytes (0 for a type llama.cpp does not know).
func (t TensorType) Block() int      { return types[t].block }
func (t TensorType) BlockBytes() int { return types[t].size }

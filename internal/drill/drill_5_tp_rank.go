package drill

func init() {
	Register(Drill{Number: 5, Name: seedNames[5][0], Expect: seedNames[5][1], Shape: Standard,
		Unavailable: "tensor-parallel groups do not exist yet"})
}

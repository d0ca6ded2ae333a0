// Macros shared by the amd64 kernels.

// HSUM8 folds the eight lanes of Y into lane 0 of X in hsum8's order, with
// T as scratch: a_k = l_k + l_(k+4), then (a0+a2) + (a1+a3).
#define HSUM8(Y, X, T) \
	VEXTRACTF128 $1, Y, T \
	VADDPS T, X, X \
	VMOVHLPS X, X, T \
	VADDPS T, X, X \
	VMOVSHDUP X, T \
	VADDSS T, X, X

// STORE3 folds three accumulators (rows 0, 1, 2 of one token) and stores
// their sums at 0, 4 and 8 bytes past O, with X0 as scratch.
#define STORE3(Y0a, X0a, Y1a, X1a, Y2a, X2a, O) \
	HSUM8(Y0a, X0a, X0) \
	VMOVSS X0a, 0(O) \
	HSUM8(Y1a, X1a, X0) \
	VMOVSS X1a, 4(O) \
	HSUM8(Y2a, X2a, X0) \
	VMOVSS X2a, 8(O)

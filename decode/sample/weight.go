package sample

import "math"

// The weights of a draw, e^((l-top)/T), come from expWeight: Shibata's
// recipe (as Go's amd64 math.Exp without FMA has it) — k = x·log₂e rounded
// to the nearest even integer, r = (x − k·ln2hi − k·ln2lo)/16, the Taylor
// series of e^r − 1 to degree 8, four squarings e ← e·(e+2), then
// (e+1)·2^k — with multiplies and adds only, each rounded to float64. The
// portable function and the assembly (weight_amd64.s, four lanes a step)
// give the same bits, on every CPU: math.Exp takes another path where the
// CPU has FMA, and another again off amd64. Below -708 the weight is 0
// (2^k would leave the normal range; e^-708 is 3e-308 of the top weight).
const (
	weightLo    = -708.0
	weightLog2e = 1.4426950408889634073599246810018920
	weightLn2Hi = 0.69314718055966295651160180568695068359375
	weightLn2Lo = 0.28235290563031577122588448175013436025525412068e-12
	weightC8    = 1.0 / 40320
	weightC7    = 1.0 / 5040
	weightC6    = 1.0 / 720
	weightC5    = 1.0 / 120
	weightC4    = 1.0 / 24
	weightC3    = 1.0 / 6
	weightC2    = 0.5
)

// expWeight is e^x for x ≤ 0 (x above 0 counts as 0; NaN stays NaN; below
// -708 it is 0). Every product is converted explicitly so that no compiler
// fuses it into an add.
func expWeight(x float64) float64 {
	if x != x {
		return x
	}
	if x < weightLo {
		return 0
	}
	if x > 0 {
		x = 0
	}
	k := math.RoundToEven(float64(x * weightLog2e))
	x -= float64(k * weightLn2Hi)
	x -= float64(k * weightLn2Lo)
	x = float64(x * (1.0 / 16))
	y := float64(weightC8*x) + weightC7
	y = float64(y*x) + weightC6
	y = float64(y*x) + weightC5
	y = float64(y*x) + weightC4
	y = float64(y*x) + weightC3
	y = float64(y*x) + weightC2
	y = float64(y*x) + 1
	e := float64(x * y)
	for range 4 {
		e = float64(e * (e + 2))
	}
	e++
	return float64(e * math.Float64frombits(uint64(int64(k)+1023)<<52))
}

// weighAll sets l[i] = expWeight((l[i]-top)/temp), four at a time where
// the CPU has the kernel.
func weighAll(l []float64, top, temp float64) {
	n4 := 0
	if weighKernel != nil {
		n4 = len(l) / 4
		if n4 > 0 {
			weighKernel(&l[0], top, temp, uintptr(n4))
		}
	}
	for i := n4 * 4; i < len(l); i++ {
		l[i] = expWeight((l[i] - top) / temp)
	}
}

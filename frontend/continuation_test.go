package frontend

import "testing"

// TestContinuationIsTheWeakestClaim: a migrated request's end names the
// weakest guarantee of the instances it ran on when they share their
// numerics, "prefix" when they do not, nothing when one did not say.
func TestContinuationIsTheWeakestClaim(t *testing.T) {
	for _, c := range []struct {
		served []servedBy
		want   string
	}{
		{[]servedBy{{"n1", "bit-exact"}, {"n1", "bit-exact"}}, "bit-exact"},
		{[]servedBy{{"n1", "bit-exact"}, {"n1", "token-exact"}}, "token-exact"},
		{[]servedBy{{"n1", "token-exact"}, {"n1", "inexact"}, {"n1", "bit-exact"}}, "inexact"},
		{[]servedBy{{"n1", "bit-exact"}, {"n2", "bit-exact"}}, "prefix"},
		{[]servedBy{{"n1", "bit-exact"}, {"n1", ""}}, ""},
		{nil, ""},
	} {
		if got := continuation(c.served); got != c.want {
			t.Errorf("%v: %q, want %q", c.served, got, c.want)
		}
	}
}

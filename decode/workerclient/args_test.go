package workerclient

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestArgsArgvParsesBack(t *testing.T) {
	for _, want := range []Args{
		{},
		{InstanceID: "n1-decode-tiny-0", Generation: 42, Role: "prefill", Listen: "10.0.0.1:7000", CertDir: "/etc/lifeline/certs",
			Preset: "small", WeightSeed: 9, ModelPath: "/m/model.bin", TokenizerPath: "/m/tok.bin", KVSocket: "/run/kv.sock",
			KVTransfer: "10.0.0.1:7100", MaxRunning: 8, MaxQueued: 16},
	} {
		argv := want.Argv()
		var got Args
		fs := pflag.NewFlagSet(Command, pflag.ContinueOnError)
		got.AddFlags(fs)
		if err := fs.Parse(argv); err != nil {
			t.Fatalf("parse %q: %v", argv, err)
		}
		if got != want {
			t.Errorf("argv %q parsed to %+v, want %+v", argv, got, want)
		}
		// Every flag is on the command line: none is left to a default.
		fs.VisitAll(func(f *pflag.Flag) {
			if !f.Changed {
				t.Errorf("flag --%s not in argv %q", f.Name, argv)
			}
		})
		if n := len(fs.Args()); n != 0 {
			t.Errorf("argv %q left %d arguments", argv, n)
		}
		for _, a := range argv {
			if !strings.HasPrefix(a, "--") {
				t.Errorf("argument %q is not a --name=value flag", a)
			}
		}
	}
}

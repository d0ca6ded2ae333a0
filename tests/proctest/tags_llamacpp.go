//go:build llamacpp

package proctest

func init() { buildTags = append(buildTags, "llamacpp") }

package localcluster

import (
	"bufio"
	"io"
)

// maxLogLine is the longest line of a child's log that scanLines passes
// to each; a child's stack dump or a large JSON log record can be long.
const maxLogLine = 1 << 20

// scanLines calls each for every line read from r until r ends. Past a
// line longer than maxLogLine it stops calling each but still reads r to
// its end into rest (nil: discarded): a pipe nobody drains fills, and the
// child blocks on its next write to it for good.
func scanLines(r io.Reader, each func(line string), rest io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLogLine)
	for sc.Scan() {
		each(sc.Text())
	}
	if sc.Err() != nil {
		if rest == nil {
			rest = io.Discard
		}
		io.Copy(rest, r)
	}
}

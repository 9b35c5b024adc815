package targets

import (
	"fmt"
	"regexp"
	"strings"
)

// What a server prints when it writes to, or reads from, a client that
// went away: the harness drops clients on purpose (a client abort, a
// network fault on the client's link), and a server that logs it has not
// crashed. Python's servers print a whole traceback for it.
var (
	abortLine = regexp.MustCompile(`(?i)broken pipe|connection reset by peer|\bBrokenPipeError\b|\bConnectionResetError\b|\bConnectionAbortedError\b|\bEPIPE\b|\bECONNRESET\b`)
	// abortError is the last line of a Python traceback for a client
	// that went away.
	abortError = regexp.MustCompile(`^(BrokenPipeError|ConnectionResetError|ConnectionAbortedError)\b`)
	// exceptionLine ends a Python traceback: an exception's name at the
	// start of a line ("ValueError: ...", "socket.timeout").
	exceptionLine = regexp.MustCompile(`^[A-Za-z_][\w.]*(: |$)`)
)

// abortNote marks what a client abort caused in a server's output.
const abortNote = "(a client the harness dropped on purpose: an injected client abort or network fault, not a crash)"

// markAborts marks, in a server's output, what the harness's own client
// aborts caused: a Python traceback that ends in BrokenPipeError (or
// ConnectionResetError) is folded into one marked line, and a line that
// says "broken pipe" or "connection reset by peer" is marked, so that no
// one reads them as the server's crash.
func markAborts(out string) string {
	if !abortLine.MatchString(out) {
		return out
	}
	lines := strings.Split(out, "\n")
	var b []string
	for i := 0; i < len(lines); i++ {
		if end, ok := abortTraceback(lines, i); ok {
			// socketserver's banner around it belongs to it.
			for len(b) > 0 && (strings.HasPrefix(b[len(b)-1], "Exception occurred during processing of request") ||
				strings.Trim(b[len(b)-1], "-") == "" && strings.HasPrefix(b[len(b)-1], "----")) {
				b = b[:len(b)-1]
			}
			b = append(b, fmt.Sprintf("[%s traceback, %d line(s), folded] %s", strings.SplitN(lines[end], ":", 2)[0], end-i+1, abortNote))
			i = end
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "----") && strings.Trim(lines[i+1], "-") == "" {
				i++
			}
			continue
		}
		line := lines[i]
		if abortLine.MatchString(line) {
			line += "  " + abortNote
		}
		b = append(b, line)
	}
	return strings.Join(b, "\n")
}

// abortTraceback reports whether a Python traceback starts at lines[i]
// and ends, at lines[end], in an exception of a client that went away,
// chained exceptions and all.
func abortTraceback(lines []string, i int) (end int, ok bool) {
	if !strings.HasPrefix(lines[i], "Traceback (most recent call last):") {
		return 0, false
	}
	for j := i + 1; j < len(lines); j++ {
		line := lines[j]
		if line == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue
		}
		if strings.HasPrefix(line, "During handling of the above exception") || strings.HasPrefix(line, "The above exception was") ||
			strings.HasPrefix(line, "Traceback (most recent call last):") {
			continue
		}
		if !exceptionLine.MatchString(line) {
			return 0, false
		}
		// The traceback ends here, unless another is chained to it.
		k := j + 1
		for k < len(lines) && lines[k] == "" {
			k++
		}
		if k < len(lines) && (strings.HasPrefix(lines[k], "During handling of the above exception") || strings.HasPrefix(lines[k], "The above exception was")) {
			j = k
			continue
		}
		return j, abortError.MatchString(line)
	}
	return 0, false
}

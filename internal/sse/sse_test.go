package sse_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/sse"
)

// readAll reads every event of r: the data payloads, and the error that
// ended the stream.
func readAll(t testing.TB, r io.Reader) ([]string, error) {
	t.Helper()
	sr := sse.NewReader(r)
	var out []string
	for {
		d, err := sr.Next()
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
}

func TestReader(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string
	}{
		{"empty stream", "", nil},
		{"only blank lines", "\n\n\n", nil},
		{"single line", "data: x\n\n", []string{"x"}},
		{"no space after the colon", "data:x\n\n", []string{"x"}},
		{"only one space is stripped", "data:  x \n\n", []string{" x "}},
		{"empty data", "data:\n\n", []string{""}},
		{"field name alone", "data\n\n", []string{""}},
		{"colons in the value", "data: {\"a\":\"b:c\"}\n\n", []string{`{"a":"b:c"}`}},
		{"multi-line data is joined by newlines", "data: a\ndata:b\ndata: c\n\n", []string{"a\nb\nc"}},
		{"multi-line data with an empty line", "data: a\ndata:\ndata: c\n\n", []string{"a\n\nc"}},
		{"comments are skipped", ": ping\n\n:\n\ndata: x\n\n", []string{"x"}},
		{"a comment inside an event", "data: a\n: keep-alive\ndata: b\n\n", []string{"a\nb"}},
		{"other fields are skipped", "event: message\nid: 7\nretry: 100\ndata: x\n\n", []string{"x"}},
		{"events without data are skipped", "event: ping\nid: 1\n\ndata: x\n\nretry: 5\n\n", []string{"x"}},
		{"field names are case-sensitive", "Data: x\ndatum: y\n data: z\n\ndata: w\n\n", []string{"w"}},
		{"events separated by blank lines", "data: a\n\ndata: b\n\n\n\ndata: c\n\n", []string{"a", "b", "c"}},
		{"CRLF line ends", "data: a\r\n\r\ndata: b\r\ndata: c\r\n\r\n", []string{"a", "b\nc"}},
		{"final event without its blank line", "data: a\n\ndata: [DONE]\n", []string{"a", "[DONE]"}},
		{"final event without a newline", "data: a\n\ndata: [DONE]", []string{"a", "[DONE]"}},
		{"final multi-line event without its blank line", "data: a\ndata: b", []string{"a\nb"}},
		{"trailing comment is not an event", "data: a\n\n: bye", []string{"a"}},
		{"an OpenAI stream", "data: {\"choices\":[]}\n\ndata: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
			[]string{`{"choices":[]}`, `{"choices":[{"finish_reason":"stop"}]}`, "[DONE]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, strings.NewReader(tc.in))
			assert.ErrorIs(t, err, io.EOF)
			assert.Equal(t, tc.want, got)

			// The framing does not depend on how the bytes arrive.
			got, err = readAll(t, iotest.OneByteReader(strings.NewReader(tc.in)))
			assert.ErrorIs(t, err, io.EOF)
			assert.Equal(t, tc.want, got, "read one byte at a time")
		})
	}
}

func TestReaderEOFIsSticky(t *testing.T) {
	r := sse.NewReader(strings.NewReader("data: x\n\n"))
	d, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, "x", d)
	for range 3 {
		d, err = r.Next()
		assert.Equal(t, io.EOF, err, "exactly io.EOF, for callers that compare")
		assert.Empty(t, d)
	}
}

func TestReaderPassesOnReadErrors(t *testing.T) {
	boom := errors.New("connection reset")
	r := sse.NewReader(io.MultiReader(
		strings.NewReader("data: a\n\ndata: b\n"),
		iotest.ErrReader(boom),
	))
	d, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, "a", d, "complete events before the error are delivered")
	_, err = r.Next()
	assert.ErrorIs(t, err, boom, "an event cut by a read error is not delivered as complete")

	// A stream cut in the middle of a chunked body.
	r = sse.NewReader(io.MultiReader(
		strings.NewReader("data: {\"choices\":"),
		iotest.ErrReader(io.ErrUnexpectedEOF),
	))
	_, err = r.Next()
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// endless yields its pattern forever and counts the bytes read from it.
type endless struct {
	pattern []byte
	off     int
	read    int
}

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = e.pattern[e.off]
		e.off = (e.off + 1) % len(e.pattern)
	}
	e.read += len(p)
	return len(p), nil
}

// slack is how far past MaxEventBytes a reader may read before it gives up:
// buffering, not growth.
const slack = 64 << 10

func TestReaderLineTooLarge(t *testing.T) {
	t.Run("a line over the limit", func(t *testing.T) {
		in := "data: " + strings.Repeat("x", sse.MaxEventBytes) + "\n\ndata: after\n\n"
		r := sse.NewReader(strings.NewReader(in))
		_, err := r.Next()
		assert.ErrorIs(t, err, sse.ErrEventTooLarge)
		_, err = r.Next()
		assert.ErrorIs(t, err, sse.ErrEventTooLarge, "the error is sticky: the stream is not read past it")
	})
	t.Run("a line that never ends", func(t *testing.T) {
		src := &endless{pattern: []byte("data: xxxxxxxxxxxxxxxx")}
		r := sse.NewReader(src)
		_, err := r.Next()
		assert.ErrorIs(t, err, sse.ErrEventTooLarge)
		assert.LessOrEqual(t, src.read, sse.MaxEventBytes+slack, "the reader stops near the limit")
	})
	t.Run("a line just under the limit", func(t *testing.T) {
		payload := strings.Repeat("y", sse.MaxEventBytes/2)
		got, err := readAll(t, strings.NewReader("data: "+payload+"\n\ndata: next\n\n"))
		assert.ErrorIs(t, err, io.EOF)
		require.Len(t, got, 2)
		assert.Equal(t, payload, got[0])
		assert.Equal(t, "next", got[1])
	})
}

// An event made of many data lines, each under the limit, must also be
// bounded by MaxEventBytes: the doc says the bound is on one event, so that
// a hostile peer cannot make a reader grow without limit.
func TestReaderEventOfManyLinesTooLarge(t *testing.T) {
	line := "data: " + strings.Repeat("z", 1000) + "\n"
	lines := 3 * sse.MaxEventBytes / len(line)
	src := &countingReader{r: strings.NewReader(strings.Repeat(line, lines) + "\n")}
	r := sse.NewReader(src)
	d, err := r.Next()
	assert.ErrorIs(t, err, sse.ErrEventTooLarge, "got an event of %d bytes", len(d))
	assert.LessOrEqual(t, src.read, sse.MaxEventBytes+slack, "the reader stops near the limit")
}

type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

func TestWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	assert.Equal(t, "text/event-stream", rec.Header().Get("Content-Type"))
	assert.Equal(t, "no-cache", rec.Header().Get("Cache-Control"))
	assert.False(t, rec.Flushed, "NewWriter writes nothing")
	assert.Empty(t, rec.Body.String())

	require.NoError(t, w.Data("x"))
	assert.Equal(t, "data: x\n\n", rec.Body.String())
	assert.True(t, rec.Flushed, "each event is flushed")
	assert.Equal(t, http.StatusOK, rec.Code)

	require.NoError(t, w.Data(`{"a":1}`))
	require.NoError(t, w.Data("[DONE]"))
	assert.Equal(t, "data: x\n\ndata: {\"a\":1}\n\ndata: [DONE]\n\n", rec.Body.String())

	got, err := readAll(t, bytes.NewReader(rec.Body.Bytes()))
	assert.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []string{"x", `{"a":1}`, "[DONE]"}, got, "what the Writer writes the Reader reads back")
}

func TestWriterKeepsStatus(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	rec.WriteHeader(http.StatusAccepted)
	require.NoError(t, w.Data("x"))
	assert.Equal(t, http.StatusAccepted, rec.Code)
	assert.Equal(t, "data: x\n\n", rec.Body.String())
}

// plainWriter is a ResponseWriter that cannot flush, and fails its writes
// when broken.
type plainWriter struct {
	h      http.Header
	body   bytes.Buffer
	broken bool
}

func (p *plainWriter) Header() http.Header { return p.h }
func (p *plainWriter) WriteHeader(int)     {}
func (p *plainWriter) Write(b []byte) (int, error) {
	if p.broken {
		return 0, errors.New("broken pipe")
	}
	return p.body.Write(b)
}

func TestWriterWithoutFlusherAndWriteErrors(t *testing.T) {
	pw := &plainWriter{h: http.Header{}}
	w := sse.NewWriter(pw)
	assert.Equal(t, "text/event-stream", pw.h.Get("Content-Type"))
	require.NoError(t, w.Data("x"))
	assert.Equal(t, "data: x\n\n", pw.body.String())

	pw.broken = true
	assert.Error(t, w.Data("y"), "a failed write is reported")
}

func FuzzReader(f *testing.F) {
	for _, seed := range []string{
		"",
		"data: x\n\n",
		"data:x\ndata: y\n\n",
		": comment\n\nevent: e\nid: 1\nretry: 3\ndata: z\n\n",
		"data: [DONE]",
		"data: a\r\n\r\ndata: b\r\n",
		"\n\n\n\ndata\n\ndata:\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"tc-a1\"}}]}\n\ndata: [DONE]\n\n",
		"data: \x00\xff\n\n:\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// Every delivered event consumes at least a "data" field name, so a
		// reader that loops more often than that never terminates.
		limit := len(in)/4 + 2
		events, total, err := readBounded(sse.NewReader(bytes.NewReader(in)), limit)
		if err == nil {
			t.Fatalf("more than %d events from %d bytes: the reader does not terminate", limit, len(in))
		}
		if len(in) < sse.MaxEventBytes {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("a small in-memory stream ended with %v, want io.EOF", err)
			}
		}
		if total > len(in) {
			t.Fatalf("%d bytes of data from %d bytes of input", total, len(in))
		}
		if len(events) > 0 && !bytes.Contains(in, []byte("data")) {
			t.Fatalf("events %q from a stream without any data field", events)
		}

		// How the bytes arrive does not change what is read.
		again, _, err2 := readBounded(sse.NewReader(iotest.OneByteReader(bytes.NewReader(in))), limit)
		if !errors.Is(err2, err) && !(errors.Is(err, io.EOF) && errors.Is(err2, io.EOF)) {
			t.Fatalf("one byte at a time: %v, whole: %v", err2, err)
		}
		if len(again) != len(events) {
			t.Fatalf("one byte at a time: %d events, whole: %d", len(again), len(events))
		}
		for i := range events {
			if again[i] != events[i] {
				t.Fatalf("event %d: one byte at a time %q, whole %q", i, again[i], events[i])
			}
		}
	})
}

// readBounded reads at most limit events; err is nil only when the limit
// was reached without the stream ending.
func readBounded(r *sse.Reader, limit int) (events []string, total int, err error) {
	for range limit {
		d, err := r.Next()
		if err != nil {
			return events, total, err
		}
		events = append(events, d)
		total += len(d)
	}
	return events, total, nil
}

func TestWriterEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	require.NoError(t, w.Event("response.created", `{"a":1}`))
	assert.Equal(t, "event: response.created\ndata: {\"a\":1}\n\n", rec.Body.String())
	assert.True(t, rec.Flushed, "each event is flushed")

	got, err := readAll(t, bytes.NewReader(rec.Body.Bytes()))
	assert.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []string{`{"a":1}`}, got, "the Reader reads the data of a named event")
}

// TestBufferedWriter: a buffered Writer writes its events without
// flushing them, and sends them when told to.
func TestBufferedWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewBufferedWriter(rec)
	assert.Equal(t, "text/event-stream", rec.Header().Get("Content-Type"))
	require.NoError(t, w.Data("x"))
	require.NoError(t, w.Event("done", "y"))
	assert.False(t, rec.Flushed, "no event is flushed on its own")
	w.Flush()
	assert.True(t, rec.Flushed, "Flush sends what was written")
	assert.Equal(t, "data: x\n\nevent: done\ndata: y\n\n", rec.Body.String())
}

package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// sessions is a session API the profile describes: a conversation of the
// harness is a session, created by one call before its first turn, and
// every turn is a call that names it and answers with an event stream.
type sessions struct {
	api *targets.SessionsAPI
	mu  sync.Mutex
	ids map[model.ConversationRef]string
	// sources are, per session id, the agent reference it was created
	// under: its turns name it ({source}) after a restart that loaded
	// another, as a client that keeps its sessions does.
	sources map[string]string
}

func newSessions(api *targets.SessionsAPI) *sessions {
	return &sessions{api: api, ids: map[model.ConversationRef]string{}, sources: map[string]string{}}
}

func (w *sessions) request(ctx context.Context, c *Client, s plan.Send, msgs []openai.Message) Request {
	req := Request{Conv: s.Conv, Method: w.api.Turn.Method, Stream: true}
	id, source, otherKey, err := w.session(ctx, c, s.Conv, s.Replica)
	req.OtherKey = otherKey
	if err != nil {
		req.Unsent = "its session could not be created: " + err.Error()
		return req
	}
	req.Session = id
	req.Path = expand(w.api.Turn.Path, pathValues(id, c.profile.Model, source))
	req.Body = []byte(expand(w.api.Turn.Body, bodyValues(id, c.profile.Model, source, msgs)))
	return req
}

// session is the id of conv's session, created now if conv has none, and
// the agent reference it was created under; otherKey says it is another
// key's. A conversation with no
// session of its own whose id another key's conversation has runs in that
// one's session: it must not be found under this key (T5).
func (w *sessions) session(ctx context.Context, c *Client, conv model.ConversationRef, replica int) (id, source string, otherKey bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if id, ok := w.ids[conv]; ok {
		return id, w.sources[id], false, nil
	}
	if id, ok := otherKeys(w.ids, conv, func(string) bool { return true }); ok {
		return id, w.sources[id], true, nil
	}
	source = c.source()
	if source == "" && w.api.NamesSource() {
		return "", "", false, errors.New("the profile names the agent source ({source}), and the server loads none")
	}
	id, err = w.create(ctx, c, conv.Key, replica, source)
	if err != nil {
		return "", "", false, err
	}
	w.ids[conv], w.sources[id] = id, source
	return id, source, false, nil
}

// create creates a session under key, through replica, naming the agent
// reference source, and returns its id.
func (w *sessions) create(ctx context.Context, c *Client, key string, replica int, source string) (string, error) {
	call := w.api.Create
	var body []byte
	if call.Body != "" {
		body = []byte(expand(call.Body, bodyValues("", c.profile.Model, source, nil)))
	}
	resp, out := c.do(ctx, replica, call.Method, expand(call.Path, pathValues("", c.profile.Model, source)), body, nil, key)
	if resp == nil {
		return "", errors.New(out.Detail)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	switch {
	case err != nil:
		return "", fmt.Errorf("%s %s: the answer broke: %w", call.Method, call.Path, err)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return "", fmt.Errorf("%s %s: status %d: %s", call.Method, call.Path, resp.StatusCode, ClipText(string(raw), 200))
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return "", fmt.Errorf("%s %s: the answer is not a JSON object: %s", call.Method, call.Path, ClipText(string(raw), 200))
	}
	switch id := fields[w.api.ID].(type) {
	case string:
		if id != "" {
			return id, nil
		}
	case float64:
		return fmt.Sprint(id), nil
	}
	return "", fmt.Errorf("%s %s: the answer has no %q: %s", call.Method, call.Path, w.api.ID, ClipText(string(raw), 200))
}

func (*sessions) headers(*Client, Request) map[string]string { return nil }

func (*sessions) learn(Request, Response) {}

func (*sessions) restarted() {}

func (w *sessions) read(ctx context.Context, _ Request, resp *http.Response, out Response) Response {
	body := io.LimitReader(resp.Body, maxResponseBytes)
	return w.readEvents(ctx, body, resp.Body, out)
}

// readEvents reads a turn's event stream: the turn succeeded only on an
// event of a Done type, failed on one of a Failure type, and is unknown
// if the stream ends before either.
func (w *sessions) readEvents(ctx context.Context, body io.Reader, closer io.Closer, out Response) Response {
	rules := w.api.Events
	return eachEvent(ctx, body, closer, "stream ended before an event that ends the turn", out, func(ev any, reply *strings.Builder, out *Response) bool {
		typ, _ := field(ev, rules.TypeField).(string)
		switch {
		case typ == rules.Text:
			if text, ok := field(ev, rules.TextField).(string); ok {
				addReply(reply, text)
			}
		case slices.Contains(rules.Done, typ):
			out.Outcome = model.OK
			return true
		case slices.Contains(rules.Failure, typ):
			out.Outcome = model.Fail
			out.Detail, out.Cause = typ+" event", CauseFailedEvent
			if msg, ok := field(ev, rules.ErrorField).(string); ok && rules.ErrorField != "" {
				out.Detail += ": " + msg
			}
			return true
		}
		return false
	})
}

// field is the value at path in a decoded JSON value: names of object
// fields and indexes of arrays, joined by dots ("message.content.0.text");
// nil where there is none.
func field(v any, path string) any {
	for name := range strings.SplitSeq(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[name]
		case []any:
			i, err := strconv.Atoi(name)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// pathValues are the placeholders of a path: each value escaped as one
// path segment. The agent reference is escaped as a query value is ("/"
// as %2F, ":" as %3A): docker-agent keys a URL source so, and matches the
// segment as it comes; a server that unescapes it gets the reference.
func pathValues(session, agent, source string) map[string]string {
	return map[string]string{"{session}": url.PathEscape(session), "{agent}": url.PathEscape(agent),
		"{source}": url.QueryEscape(source)}
}

// bodyValues are the placeholders of a body: each value a JSON value.
func bodyValues(session, agent, source string, msgs []openai.Message) map[string]string {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	all := make([]message, len(msgs))
	last := ""
	for i, m := range msgs {
		all[i] = message{Role: string(m.Role), Content: string(m.Content)}
		last = string(m.Content)
	}
	return map[string]string{"{session}": jsonText(session), "{agent}": jsonText(agent), "{source}": jsonText(source),
		"{message}": jsonText(last), "{messages}": jsonText(all)}
}

// jsonText is v as JSON.
func jsonText(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings and plain structs always encode
	}
	return string(raw)
}

// expand replaces the placeholders of template with their values.
func expand(template string, values map[string]string) string {
	pairs := make([]string, 0, 2*len(values))
	for k, v := range values {
		pairs = append(pairs, k, v)
	}
	return strings.NewReplacer(pairs...).Replace(template)
}

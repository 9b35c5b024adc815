// Package protocol is the only code that knows how a turn is sent to a
// server and how its outcome is read off the wire: the chat endpoint with
// a conversation header, its JSON answers and its event streams.
package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// maxResponseBytes bounds what the client reads of one response.
const maxResponseBytes = 8 << 20

// maxKeptReply bounds the reply text a history keeps of one response: the
// checker looks only for the reply token, which the fake model writes
// early, and a run keeps every response until it ends.
const maxKeptReply = 64 << 10

// Request is one request the harness sends: enough to send it again by hand.
type Request struct {
	Conv model.ConversationRef `json:"conversation"`
	// Method and Path are where it was sent; "" for POST
	// /v1/chat/completions.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Body is the JSON body exactly as sent.
	Body json.RawMessage `json:"body"`
	// Replica is the replica of the server it went to (plan.Send.Replica).
	Replica int `json:"replica,omitempty"`
	// Unsent says why the request was not sent at all (a session that
	// could not be created): the turn then failed before it began.
	Unsent string `json:"unsent,omitempty"`
	// ChainedFrom is the response a Responses API turn chains from, and
	// Session the session a session API's turn runs in: ids the server
	// made, which a report names by the turn they came from.
	ChainedFrom string `json:"chainedFrom,omitempty"`
	Session     string `json:"session,omitempty"`
	// OtherKey reports a request that names another key's conversation
	// (its session, its context) for a conversation of its own id under
	// this key, which this key must not find (T5): a refusal as not found
	// is what it calls for.
	OtherKey bool `json:"otherKey,omitempty"`
	// Stream reports whether the body asks for a stream.
	Stream bool `json:"stream,omitempty"`
	// Tag, if set, is sent as targets.RequestTagHeader: a server that
	// reports which client it saw go away names the request by it. It is
	// the harness's, not the turn's, and is not saved.
	Tag string `json:"-"`
	// Waits, if not nil, is closed once the request may go: until then
	// the client holds it back, waiting on another request of the step
	// (an A2A turn beside its conversation's first, until that one names
	// the context). It is the harness's, and is not saved.
	Waits <-chan struct{} `json:"-"`
	// Goes, if not nil, is closed by the harness once a request held back
	// (Waits) may go, after Waits closed: it lets such requests go one
	// at a time, in the order sent. Not saved.
	Goes <-chan struct{} `json:"-"`
	// Stopped, if set, is called at most once, while the request is
	// still open, when the server says it stopped the turn its client
	// cancelled: an A2A task answered canceled, in the answer to
	// tasks/cancel or on the task's stream. From then on what the server
	// still waits on is its own doing (PROTOCOL.md, "Time"). It is the
	// harness's, and is not saved.
	Stopped func() `json:"-"`
	// Named are the headers that name the conversation, as sent, its
	// session's namespace on its id (chat's conversation header; a
	// Responses API conversation's where responses.named_by is header):
	// what a report's curl sends too.
	Named map[string]string `json:"named,omitempty"`
	// Setup are the JSON-RPC messages an ACP request's session took
	// before its prompt (session/new, or session/load after a restart),
	// each as written to the agent, its id aside (the connection's):
	// what a report shows beside the prompt, Body.
	Setup []json.RawMessage `json:"setup,omitempty"`
	// Replay is what the agent replayed of the conversation when the
	// client loaded its session (ACP's session/load) before this request:
	// the history it holds, as tokens; nil if there was no load.
	Replay []model.Token `json:"replay,omitempty"`
	// ReplayForeign are the tokens a load replayed of another check's
	// conversations (a user message with another check's tag, and the
	// reply after it), left out of Replay, and ReplayForeignFrom the
	// tags of those checks (model.OtherChecks).
	ReplayForeign     []model.Token `json:"replayForeign,omitempty"`
	ReplayForeignFrom []string      `json:"replayForeignFrom,omitempty"`
	// deny says to deny the agent's permission requests while the turn
	// runs (ACP), and unsentStatus is the status a request not sent is
	// read as failing with (0: none).
	deny         bool
	unsentStatus int
	// noUser marks a request without a new user message, noStore one
	// whose response is not to be stored, and inConversation one that
	// names a Responses API conversation: none moves a chain.
	noUser, noStore, inConversation bool
	// tok is the token of the turn's user message ("" for none), and
	// taskAbort how an A2A client aborts its task (plan.Send.TaskAbort).
	tok       model.Token
	taskAbort string
	// founds marks an A2A turn sent without a context, whose answer names
	// its conversation's context; beside is an A2A turn beside its
	// conversation's first, sent once that one named the context (or
	// ended), and its body built then.
	founds bool
	// unsentCause is the cause a request not sent (Unsent) ends with,
	// where it is not CauseUnsent.
	unsentCause string
	beside      *a2aBeside
	// run is the run of the server a Responses API request was made for
	// (responses.runs).
	run int
}

// Response is what the client learned of a request.
type Response struct {
	Outcome model.Outcome `json:"outcome"`
	// ID is the id the server gave the turn's response, where the protocol
	// names one (a Responses API response id).
	ID string `json:"id,omitempty"`
	// Status is the HTTP status, 0 if none was received.
	Status int `json:"status,omitempty"`
	// Reply is the assistant text received (a partial one on a broken
	// stream).
	Reply string `json:"reply,omitempty"`
	// Detail says what happened in a few words: the error message, or why
	// the outcome is unknown.
	Detail string `json:"detail,omitempty"`
	// TimedOut reports a request the server took and never answered, not
	// even with a status, within the client's time.
	TimedOut bool `json:"timedOut,omitempty"`
	// Cause names, for a turn that did not end ok, why, in a few words
	// that a run's summary counts by: "status 502", "error chunk",
	// "connection refused", "no finish_reason stop", ...
	Cause string `json:"cause,omitempty"`
	// Open reports that the client stopped reading before the server
	// ended the response (an error chunk followed by a stream that did
	// not end within ErrorDrain).
	Open bool `json:"open,omitempty"`
	// Code is the error body's code, where it has one
	// ("previous_response_not_found").
	Code string `json:"code,omitempty"`
	// StopReason is an ACP prompt's stopReason, or the state an A2A task
	// ended in; "" without one.
	StopReason string `json:"stopReason,omitempty"`
	// Breaches are what an ACP agent did while the turn ran that the
	// protocol does not allow it: a call back the client did not
	// advertise, an answer other than cancelled after session/cancel.
	Breaches []string `json:"breaches,omitempty"`
	// ForeignFrom are the tags of other checks (model.OtherChecks) whose
	// messages a breach showed: an A2A task's history read back holding
	// an earlier check's messages.
	ForeignFrom []string `json:"foreignFrom,omitempty"`
	// Preempted reports a turn the server gave up (ACP: answered
	// cancelled, not asked) once a later request of its conversation came:
	// the later one was neither queued nor refused (T4).
	Preempted bool `json:"preempted,omitempty"`
	// Cancelled reports a turn the client cancelled itself (ACP's
	// session/cancel): its abort, the end of its time, or an abort of
	// another prompt of the session, ACP's cancel being the session's.
	// Its outcome is unknown, and it is judged as an interrupted turn
	// (T10), whether or not the plan drew an abort of it.
	Cancelled bool `json:"cancelled,omitempty"`
	// Sent, if not nil, is the request as it finally went, where the
	// client completed it only once it could go (Request.Waits): what a
	// report shows. Not saved apart from the request.
	Sent *Request `json:"-"`
	// RanOn reports a turn the client aborted whose server ran it on all
	// the same, as far as the harness can tell: an A2A task whose
	// tasks/cancel could not be sent (its id not known yet). Its outcome
	// is read as any, and it is judged as an unknown turn, not an
	// interrupted one.
	RanOn bool `json:"ranOn,omitempty"`
}

// CodeNotFound is the code of OpenAI's answer to a previous_response_id it
// does not have: 400 previous_response_not_found.
const CodeNotFound = "previous_response_not_found"

// SaysStopped reports whether the answer says the server stopped the turn
// its client cancelled: an ACP prompt answered cancelled, an A2A task that
// ended canceled once the client asked.
func (r Response) SaysStopped() bool {
	return r.Cancelled && (r.StopReason == "cancelled" || r.StopReason == "canceled")
}

// NotFound reports whether r says that what the request names is not
// found: 404, or OpenAI's 400 previous_response_not_found.
func (r Response) NotFound() bool {
	return r.Outcome == model.Fail && (r.Status == http.StatusNotFound || r.Status == http.StatusBadRequest && r.Code == CodeNotFound)
}

// The causes a summary counts outcomes by, where a status does not say.
const (
	CauseRefused   = "connection refused"
	CauseNoAnswer  = "no response (connection broke)"
	CauseTimedOut  = "no response within the client's time"
	CauseAborted   = "client abort (injected)"
	CauseNoDone    = "stream never ended with [DONE]"
	CauseNoStop    = "no finish_reason stop before [DONE]"
	CauseMalformed = "malformed chunk"
	CauseNoBody    = "200 without a chat.completion body"
	CauseChunk     = "error chunk"
	CauseRunEnded  = "still open when the run ended"
	CauseUnsent    = "not sent (the protocol's call before it failed)"
	// CauseNothingToName is a request not sent though nothing failed:
	// what it was to name was not there (an A2A message naming a
	// finished task, before any task of its conversation ended), or the
	// client gave it up while it waited to go.
	CauseNothingToName = "not sent (nothing failed: what it was to name was not there, or it was given up while it waited)"
	// The Responses API's and session APIs' own.
	CauseNoResponse   = "200 without a response object"
	CauseNotCompleted = "stream ended before the turn completed"
	CauseFailedEvent  = "failure event"
)

// NotSent reports whether cause is a request's that never reached the
// server.
func NotSent(cause string) bool { return cause == CauseUnsent || cause == CauseNothingToName }

// ErrorDrain bounds how long the client keeps reading a stream after an
// error chunk, for the server to end the response: a server may finish
// the turn (and release its conversation) only once it has. It never
// decides a verdict against a server: one that has not ended the
// response by then is only excused a 409 to the next request.
const ErrorDrain = 2 * time.Second

// Client speaks one server's client protocol (the profile's): it builds
// each turn's request, sends it, and reads what the turn came to.
type Client struct {
	// bases are the server's base URLs: its replicas', or its own.
	bases   []string
	profile targets.Profile
	// ns prefixes every conversation id sent: the session's namespace on
	// a server shared by several.
	ns   string
	http *http.Client
	wire wire
	// sources are the agent references the server loads now (Loaded).
	mu      sync.Mutex
	sources []string
}

// A wire is one client protocol: the only code that knows how a turn is
// named on the wire and how its outcome is read. A wire may keep state
// between turns (the response a conversation's chain ends with, the
// session it runs in), safe for concurrent use.
type wire interface {
	// request builds the request of send s, which carries msgs: s's
	// messages, with the session's namespace on them.
	request(ctx context.Context, c *Client, s plan.Send, msgs []openai.Message) Request
	// headers are the headers, beside Content-Type and Authorization,
	// that req is sent with.
	headers(c *Client, req Request) map[string]string
	// read reads what the turn came to from resp, a response with a
	// status from 200 to 299; out has the status already.
	read(ctx context.Context, req Request, resp *http.Response, out Response) Response
	// learn keeps what the turn's outcome says of its conversation.
	learn(req Request, out Response)
	// restarted is told that the server restarted.
	restarted()
}

// NewClient returns a client of the server at bases (its replicas, or
// itself), as p reaches it, that names every conversation under the
// namespace ns ("" for none).
func NewClient(bases []string, p targets.Profile, ns string) *Client {
	c := &Client{
		bases:   trimmed(bases),
		profile: p,
		ns:      ns,
		http: &http.Client{
			Timeout:   p.RequestTimeout(),
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
		},
	}
	switch p.Protocol {
	case targets.Responses:
		c.wire = newResponses(p.ResponsesAPI)
	case targets.Sessions:
		c.wire = newSessions(p.SessionsAPI)
	case targets.ACP:
		c.wire = newACP()
	case targets.A2A:
		c.wire = newA2A(p.A2AAPI)
	default:
		c.wire = chat{}
	}
	return c
}

// Attach tells the client the server it talks to: an ACP agent is
// reached through the server's own connection to it, not a URL.
func (c *Client) Attach(srv targets.Server) {
	if a, ok := c.wire.(*acpWire); ok {
		a.attach(srv)
	}
}

// Close drops the client's idle connections, and its routes of an ACP
// agent's updates.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
	if a, ok := c.wire.(*acpWire); ok {
		a.close()
	}
}

// Rebase points the client at a server restarted at bases, dropping the
// connections to the old one.
func (c *Client) Rebase(bases []string) {
	c.http.CloseIdleConnections()
	c.bases = trimmed(bases)
	c.wire.restarted()
}

// Loaded tells the client the agent references the server loads now, at
// its start and after a restart that changed them: a session created from
// now on names the first ({source}); one created before keeps naming the
// reference it was created under, as a real client does.
func (c *Client) Loaded(refs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = slices.Clone(refs)
}

// source is the agent reference a session created now names, "" if the
// server loads none.
func (c *Client) source() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sources) == 0 {
		return ""
	}
	return c.sources[0]
}

// trimmed is bases without their trailing slashes.
func trimmed(bases []string) []string {
	out := make([]string, len(bases))
	for i, b := range bases {
		out[i] = strings.TrimRight(b, "/")
	}
	return out
}

// NewRequest builds the request of s; ctx bounds what the protocol must do
// before (create a session). On a server shared by several sessions,
// every user message with a token also carries the session's namespace,
// which the fake model tells this session's calls by.
func (c *Client) NewRequest(ctx context.Context, s plan.Send) Request {
	msgs := s.Messages
	if c.ns != "" {
		tagged := make([]openai.Message, len(msgs))
		for i, m := range msgs {
			tagged[i] = m
			if m.Role == openai.RoleUser && len(model.Tokens(string(m.Content))) > 0 {
				tagged[i].Content = openai.Content(fmt.Sprintf("%s %s", m.Content, EpochTag(c.ns)))
			}
		}
		msgs = tagged
	}
	req := c.wire.request(ctx, c, s, msgs)
	req.Replica = s.Replica
	req.Named = c.wire.headers(c, req)
	return req
}

// Resolve is what send s is on the wire as it stands now: under the
// Responses API, a branch drawn on a server whose chains run on one line
// (targets.ResponsesAPI.Branches) is no branch where its base has a
// response to chain from: chained from it, it runs on the base's line,
// and is a turn of the base's conversation. A base with none yet starts a
// new line: the branch stays a conversation of its own. Decided as the
// step is sent, so that a shrunk run, whose bases may have no response,
// is judged by what it sends.
func (c *Client) Resolve(s plan.Send) plan.Send {
	if w, ok := c.wire.(*responses); ok && s.From != nil && !w.api.Branches() && w.chained(*s.From) {
		s.Conv, s.From = *s.From, nil
	}
	return s
}

// Send sends req and reads the outcome. Cancelling ctx aborts the request:
// the client drops the connection, and the outcome is unknown.
func (c *Client) Send(ctx context.Context, req Request) Response {
	if a, ok := c.wire.(*acpWire); ok {
		return a.send(ctx, c, req)
	}
	if a, ok := c.wire.(*a2aWire); ok {
		return a.send(ctx, c, req)
	}
	if req.Unsent != "" {
		// Nothing of the turn reached the server: it failed before it
		// began, and changed nothing.
		return Response{Outcome: model.Fail, Detail: req.Unsent, Cause: CauseUnsent}
	}
	headers := c.wire.headers(c, req)
	if req.Tag != "" {
		headers = maps.Clone(headers)
		if headers == nil {
			headers = map[string]string{}
		}
		headers[targets.RequestTagHeader] = req.Tag
	}
	resp, out := c.do(ctx, req.Replica, req.Method, req.Path, req.Body, headers, req.Conv.Key)
	if resp == nil {
		c.wire.learn(req, out)
		return out
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 400:
		out.Outcome = model.Fail
		out.Detail, out.Code = errorMessage(io.LimitReader(resp.Body, maxResponseBytes))
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		out = unexpected(resp.StatusCode, out)
	default:
		out = c.wire.read(ctx, req, resp, out)
	}
	if out.Outcome != model.OK && out.Cause == "" {
		out.Cause = fmt.Sprintf("status %d", resp.StatusCode)
		if ctx.Err() != nil {
			out.Cause = CauseAborted
		}
	}
	c.wire.learn(req, out)
	return out
}

// do sends one HTTP request to a replica of the server (POST to
// /v1/chat/completions where method and path are ""), with key's
// Authorization, and returns the response, whose body the caller closes,
// and out with its status; or no response, and out saying why.
func (c *Client) do(ctx context.Context, replica int, method, path string, body []byte, headers map[string]string, key string) (*http.Response, Response) {
	if replica < 0 || replica >= len(c.bases) {
		return nil, Response{Outcome: model.Fail, Detail: fmt.Sprintf("no replica %d: the server runs %d", replica, len(c.bases)), Cause: CauseUnsent}
	}
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, method, c.bases[replica]+path, rd)
	if err != nil {
		return nil, Response{Outcome: model.Unknown, Detail: err.Error()}
	}
	hr.Header.Set("Content-Type", "application/json")
	if key != "" {
		hr.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range headers {
		hr.Header.Set(k, v)
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		var timeout net.Error
		out := Response{Outcome: model.Unknown, Detail: "no response: " + transportError(ctx, err),
			TimedOut: ctx.Err() == nil && errors.As(err, &timeout) && timeout.Timeout()}
		out.Cause = transportCause(ctx, err, out.TimedOut)
		return nil, out
	}
	return resp, Response{Status: resp.StatusCode}
}

// transportCause names why a request got no response at all.
func transportCause(ctx context.Context, err error, timedOut bool) string {
	switch {
	case ctx.Err() != nil:
		return CauseAborted
	case timedOut:
		return CauseTimedOut
	case errors.Is(err, syscall.ECONNREFUSED):
		return CauseRefused
	}
	return CauseNoAnswer
}

// ClipText keeps at most n bytes of s, saying when it cut.
func ClipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// clipReply keeps at most maxKeptReply bytes of a reply.
func clipReply(s string) string {
	if len(s) > maxKeptReply {
		return s[:maxKeptReply]
	}
	return s
}

// errorMessage reads an error response: its message, and its code, if it
// has one.
func errorMessage(r io.Reader) (msg, code string) {
	raw, _ := io.ReadAll(io.LimitReader(r, 4096))
	msg, ok := openai.ReadErrorMessage(bytes.NewReader(raw))
	if !ok {
		return "body not an OpenAI error: " + msg, ""
	}
	var body struct {
		Error struct {
			Code json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil {
		_ = json.Unmarshal(body.Error.Code, &code) // a code that is not a string is none
	}
	return msg, code
}

func transportError(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return "the client aborted"
	}
	return err.Error()
}

// EpochTag is the text every user message of a session on a shared
// server carries, "" for a server of its own; whole, with its
// parentheses, so that no session's tag is part of another's.
func EpochTag(ns string) string {
	if ns == "" {
		return ""
	}
	return "(" + strings.TrimSuffix(ns, "-") + ")"
}

// streamEnded is out for a stream that ended, with err, before an event
// said how the turn ended: its outcome is unknown. ended says why, for a
// stream that ended cleanly; cause is what a summary counts it by.
func streamEnded(ctx context.Context, err error, reply, ended, cause string, out Response) Response {
	out.Reply, out.Outcome = reply, model.Unknown
	out.Detail, out.Cause = ended, cause
	if !errors.Is(err, io.EOF) {
		out.Detail = "stream broke: " + transportError(ctx, err)
		var timeout net.Error
		switch {
		case ctx.Err() != nil:
			out.Cause = CauseAborted
		case errors.As(err, &timeout) && timeout.Timeout():
			// The client's own time ran out mid-stream: it closes the
			// connection, as it does before any answer.
			out.Cause, out.TimedOut = "stream never ended within the client's time", true
		}
	}
	return out
}

// otherKeys is what m holds for conversation conv's id under another key
// (the first such key in order, of those keep accepts): a conversation of
// one key that a turn of another sends its turn to, which that key must
// not find (T5).
func otherKeys[T any](m map[model.ConversationRef]T, conv model.ConversationRef, keep func(T) bool) (T, bool) {
	var found model.ConversationRef
	for ref, v := range m {
		if ref.ID == conv.ID && ref.Key != conv.Key && keep(v) && (found.ID == "" || ref.Key < found.Key) {
			found = ref
		}
	}
	v, ok := m[found]
	return v, ok && found.ID != ""
}

// unexpected is out for a status that says neither success nor failure:
// the outcome is unknown.
func unexpected(status int, out Response) Response {
	out.Outcome = model.Unknown
	out.Detail = fmt.Sprintf("unexpected status %d", status)
	return out
}

// malformed is out for a stream whose what (a chunk, an event) could not
// be read, after reply: the outcome is unknown.
func malformed(reply, what string, out Response) Response {
	out.Reply, out.Outcome = reply, model.Unknown
	out.Detail, out.Cause = "malformed "+what+" from the server", CauseMalformed
	return out
}

// eachEvent reads a stream of JSON events, each decoded into an E and
// handed to on with the reply text so far, until on says the event ended
// the turn (and set its outcome); a stream that ends first leaves the
// outcome unknown, ended saying so. After the event that ended the turn,
// the rest of the stream is read, as after [DONE] under chat (a server
// may release the conversation only once it ends the response), for at
// most ErrorDrain; closer, if not nil, ends the read then, and a response
// still open is Open.
func eachEvent[E any](ctx context.Context, body io.Reader, closer io.Closer, ended string, out Response, on func(ev E, reply *strings.Builder, out *Response) bool) Response {
	var reply strings.Builder
	events := sse.NewReader(body)
	for {
		data, err := events.Next()
		if err != nil {
			return streamEnded(ctx, err, reply.String(), ended, CauseNotCompleted, out)
		}
		var ev E
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return malformed(reply.String(), "event", out)
		}
		if on(ev, &reply, &out) {
			// The response ends with its body, not with the event that
			// ended the turn: a server may release the conversation in
			// between (docker-agent's serve api releases its session
			// after stream_stopped), and the next request must not race
			// it.
			out.Reply = reply.String()
			if closer != nil {
				out.Open = !drain(events, closer)
			}
			return out
		}
	}
}

// addReply keeps text as more of a reply, up to maxKeptReply.
func addReply(reply *strings.Builder, text string) {
	if reply.Len() < maxKeptReply {
		reply.WriteString(clipReply(text))
	}
}

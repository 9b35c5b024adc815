package faults

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
)

// The tools the fake model asks for, by name. A server under test offers
// them to the model (ChatRequest.Tools) and runs them when asked.
const (
	// ToolEcho is a tool the server runs on its own: its result is the
	// "text" argument. The fake model never sees it run.
	ToolEcho = "echo"
	// ToolLookup is a tool the server runs by asking the fake model: GET
	// {model}/tools/lookup?key=K with the "key" argument, the response body
	// its result. The fake model sees it start (RunsAfter) and can hold it
	// there (HoldAt with Point.Tool).
	ToolLookup = "lookup"
)

// Round is one round of a tool loop: the tools the model calls at once, by
// name (ToolEcho or ToolLookup).
type Round []string

// Reply is the fake model's whole script for one turn: the rounds of tool
// calls it asks for before it replies, and the fault it injects.
//
// The model reads where a call stands in the loop from the results it
// carries: k rounds are done when, for each of rounds 1..k, every call of
// one asking of it (ids model.ToolCallRef{tok, r, i, asking}.ID()) has a
// tool result in the request. While k < len(Rounds) it asks for round
// k+1; then it replies. A request that does not offer every tool of the
// next round gets the reply at once, so that a server without tools is
// checked without tool rounds.
//
// Each answer that asks for a round is that round's next asking, counted
// per turn and round over the check (see Reset), and its calls have ids
// of their own: a retried turn, whose user token is the same, or a round
// a server asks the model for again, never repeats an id.
type Reply struct {
	Rounds []Round `json:"rounds,omitempty"`
	Fault  Fault   `json:"fault,omitzero"`
}

// Point is a place in a turn where the fake model can hold it (HoldAt).
type Point struct {
	// Round is the model call of the turn's tool loop: 0 the first, k the
	// one that carries the results of k rounds.
	Round int `json:"round,omitempty"`
	// Chunks holds that call after this many chunks of its streamed answer
	// (the role chunk does not count; each content or tool-call chunk
	// does), once they are flushed: 0 before answering at all, beyond the
	// answer's length before its finish chunk. A call answered whole is
	// held before it is answered.
	Chunks int `json:"chunks,omitempty"`
	// Tool, if > 0, holds instead the Tool-th tool call (from 1) of round
	// Round (Round >= 1), of whichever asking of the round runs first,
	// which must be a lookup: its GET /tools/lookup request is held.
	Tool int `json:"tool,omitempty"`
}

// normal is p as gates are kept: a lookup has no chunks, and a count below
// zero is zero.
func (p Point) normal() Point {
	p.Round, p.Chunks, p.Tool = max(p.Round, 0), max(p.Chunks, 0), max(p.Tool, 0)
	if p.Tool > 0 {
		p.Chunks = 0
	}
	return p
}

// RunsAfter returns the lookups that started after at, on the model's
// timeline (ModelConfig.Clock), in arrival order: the tool runs of this
// check (see Reset's epoch).
func (m *Model) RunsAfter(at int64) []model.ToolRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, _ := slices.BinarySearchFunc(m.runs, at, func(r model.ToolRun, at int64) int { return cmp.Compare(r.At, at+1) })
	return slices.Clone(m.runs[i:])
}

// RunCount is how many lookups the model has recorded, as CallCount is
// for calls.
func (m *Model) RunCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.runs)
}

// completedRounds is how many of rounds the request's tool results complete,
// in order: the largest k such that, for each of rounds 1..k of the turn
// tok, every call of one asking of it has a result. Any asking will do: a
// server may keep the rounds an earlier attempt of the turn completed, or
// complete a round the model asked for again.
func completedRounds(tok model.Token, rounds []Round, msgs []openai.Message) int {
	if len(rounds) == 0 {
		return 0
	}
	answered := map[model.ToolCallRef]bool{}
	askings := map[int][]int{} // by round, the askings with a result
	for _, msg := range msgs {
		if msg.Role != openai.RoleTool {
			continue
		}
		if r, ok := model.ParseToolCallID(msg.ToolCallID); ok && r.User == tok && !answered[r] {
			answered[r] = true
			askings[r.Round] = append(askings[r.Round], r.Asking)
		}
	}
	for k, round := range rounds {
		whole := func(asking int) bool {
			for i := range round {
				if !answered[model.ToolCallRef{User: tok, Round: k + 1, Call: i + 1, Asking: asking}] {
					return false
				}
			}
			return true
		}
		if !slices.ContainsFunc(askings[k+1], whole) {
			return k
		}
	}
	return len(rounds)
}

// offers reports whether the request offers every tool of round.
func offers(tools []openai.Tool, round Round) bool {
	for _, name := range round {
		if !slices.ContainsFunc(tools, func(t openai.Tool) bool { return t.Function.Name == name }) {
			return false
		}
	}
	return true
}

// toolAnswer asks for the tool calls of round r (from 1) of the turn tok,
// as the round's asking-th asking (ids model.ToolCallRef.ID). A lookup's
// key carries the model's epoch, if any, after a space, so that a late
// lookup of an earlier check on a shared server can be told apart. Each
// call streams as three chunks: its id and name, then each half of its
// arguments, as OpenAI splits them.
func toolAnswer(tok model.Token, r, asking int, names Round, epoch string) answerText {
	a := answerText{
		message: openai.Message{Role: openai.RoleAssistant},
		finish:  openai.FinishToolCalls,
	}
	for i, name := range names {
		id := model.ToolCallRef{User: tok, Round: r, Call: i + 1, Asking: asking}.ID()
		args := map[string]string{"text": id}
		if name == ToolLookup {
			key := id
			if epoch != "" {
				key += " " + epoch
			}
			args = map[string]string{"key": key}
		}
		raw, _ := json.Marshal(args) // a map of strings always encodes
		text := string(raw)
		a.message.ToolCalls = append(a.message.ToolCalls, openai.ToolCall{ID: id, Type: openai.TypeFunction,
			Function: openai.FunctionCall{Name: name, Arguments: text}})
		half := len(text) / 2
		for half > 0 && !utf8.RuneStart(text[half]) {
			half-- // each piece must be valid text on its own
		}
		a.deltas = append(a.deltas,
			openai.Delta{ToolCalls: []openai.ToolCallDelta{{Index: i, ID: id, Type: openai.TypeFunction,
				Function: openai.FunctionDelta{Name: name}}}},
			openai.Delta{ToolCalls: []openai.ToolCallDelta{{Index: i, Function: openai.FunctionDelta{Arguments: text[:half]}}}},
			openai.Delta{ToolCalls: []openai.ToolCallDelta{{Index: i, Function: openai.FunctionDelta{Arguments: text[half:]}}}},
		)
	}
	return a
}

// serveLookup runs the lookup tool: GET /tools/lookup?key=K (or under /v1)
// answers 200 text/plain "value of K", the same for the same K. K is a
// tool call id the model gave (model.ToolCallRef.ID), then, when the model
// has an epoch, a space and the epoch. A lookup of this check (no epoch
// set, or K carries the current one) is recorded as a model.ToolRun of
// that id, and held if a gate is set at its point; any other is answered
// and otherwise ignored. A method other than GET is 405; a missing key, or
// one that does not start with a tool call id, is 400.
func (m *Model) serveLookup(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use GET")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	keys := q["key"]
	if err != nil || len(keys) != 1 || keys[0] == "" {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", "want one key: GET /tools/lookup?key=K")
		return
	}
	key := keys[0]
	id, tag, _ := strings.Cut(key, " ")
	call, ok := model.ParseToolCallID(id)
	if !ok {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("key %q does not start with a tool call id", key))
		return
	}
	// A point names a call of a round, whichever asking of it runs.
	recorded, gate := m.recordRun(id, tag, call.User, Point{Round: call.Round, Tool: call.Call})
	if m.cfg.Log != nil {
		m.logMu.Lock()
		fmt.Fprintf(m.cfg.Log, "lookup key=%q run=%s recorded=%t held=%t\n", key, id, recorded, gate != nil)
		m.logMu.Unlock()
	}
	if gate != nil && !m.hold(r, gate) {
		return // the server gave up on the lookup
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "value of "+key)
}

// recordRun records a lookup of the tool call id whose key carries tag
// after the id, if it is of the current epoch, and takes the gate of the
// turn tok at its point, if any.
func (m *Model) recordRun(id, tag string, tok model.Token, at Point) (bool, *Gate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epoch != "" && tag != m.epoch {
		return false, nil
	}
	when := m.stamp()
	m.runs = append(m.runs, model.ToolRun{ID: id, At: when})
	if g := m.dropGateLocked(tok, when); g != nil {
		return true, g // its client went away: held, unanswered
	}
	s := m.scripts[tok]
	if s == nil {
		return true, nil
	}
	g := s.gates[at]
	if g != nil {
		delete(s.gates, at)
		m.holding[g] = true
		g.at = when
	}
	return true, g
}

package turn

import (
	"context"
	"fmt"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// MaxToolRounds bounds the tool rounds of one turn: a model that asks for
// tools once more fails the turn (502), as a model that asks forever would
// otherwise hold its conversation for good.
const MaxToolRounds = 8

// loop runs the turn's tool loop on its working copy and returns the
// model's final reply. Each round is a model call that asks for tool
// calls: the loop appends an assistant message with the calls, then, call
// by call in order, a tool message with its result, and calls the model
// again with the grown history. The model's first 200 starts the client's
// answer (onStart); onDelta relays the text of the final reply.
//
// An interruption (ctx ending) stops the loop at once: the model call or
// tool run under way is cancelled through ctx, and the loop looks at ctx
// before every model call and every tool run, so none starts after it.
// What the interrupted turn leaves is decided by the caller (interruption.go).
func (s *Engine) loop(ctx context.Context, t *Turn, onStart func(), onDelta func(string)) (string, error) {
	started := false
	start := func() {
		if !started {
			started = true
			onStart()
		}
	}
	for round := 0; ; round++ {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		s.compact(t)
		ans, err := s.callModel(ctx, t, start, onDelta)
		if err != nil {
			return ans.text, err
		}
		if len(ans.calls) == 0 {
			return ans.text, nil
		}
		if round == MaxToolRounds {
			return "", &upstreamError{msg: fmt.Sprintf("model asked for tools after %d rounds of them", MaxToolRounds), started: true}
		}
		if err := s.runTools(ctx, t, ans.calls); err != nil {
			return "", err
		}
	}
}

// callModel makes one model call of the turn, with its own deadline, on
// what the working copy shows the model.
func (s *Engine) callModel(ctx context.Context, t *Turn, onStart func(), onDelta func(string)) (answer, error) {
	ctx, cancel := s.Cfg.Deadlines.WithTimeout(ctx, s.Cfg.RequestTimeout)
	defer cancel()
	instruction := systemPrompt
	if t.agent != nil {
		instruction = t.agent.instruction
	}
	history := append([]openai.Message{{Role: openai.RoleSystem, Content: openai.Content(instruction)}}, t.Work.Visible()...)
	// The call's request is reserved before it is encoded, and given back
	// when the call ends; its reply is reserved as it comes, and held
	// until the request ends.
	mem := admission.ReservationOf(ctx)
	cost := admission.HistoryCost(history)
	if !mem.Grow(cost) {
		return answer{}, admission.ErrOverBudget
	}
	defer mem.Shrink(cost)
	s.stall(ctx)
	return s.Up.complete(ctx, history, offeredTools, mem, onStart, onDelta)
}

// runTools runs one round of tool calls and appends it to the working
// copy: the assistant message that asks for the calls, then each call's
// result. Once every result is in, the round is settled: a T9-consistent
// prefix that the keep-consistent policy may keep.
func (s *Engine) runTools(ctx context.Context, t *Turn, calls []openai.ToolCall) error {
	t.Work.Messages = append(t.Work.Messages, &store.Message{Message: openai.Message{Role: openai.RoleAssistant, ToolCalls: calls}})
	if t.ToolNotes != nil {
		t.ToolNotes.ToolCalls(calls)
	}
	toolCtx, checkEach := s.toolContext(ctx)
	for _, call := range calls {
		if checkEach && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		result, err := s.tools.Run(toolCtx, call)
		if err != nil {
			return err
		}
		t.Work.Messages = append(t.Work.Messages, &store.Message{Message: openai.Message{
			Role: openai.RoleTool, ToolCallID: call.ID, Content: openai.Content(result)}})
		if t.ToolNotes != nil {
			t.ToolNotes.ToolResult(call, result)
		}
	}
	t.settled = len(t.Work.Messages)
	return nil
}

// toolObserver hears of a turn's tool rounds as they run (turn.toolNotes):
// the calls of a round as it starts, then each call's result as it comes.
type toolObserver interface {
	ToolCalls(calls []openai.ToolCall)
	ToolResult(call openai.ToolCall, result string)
}

// toolContext is the context a round's tools run under, and whether the
// loop looks for an interruption before each of them. The
// tool-runs-after-cancel mutant detaches the tools from the request and
// looks only before model calls.
func (s *Engine) toolContext(ctx context.Context) (toolCtx context.Context, checkEach bool) {
	if s.Cfg.Mutant == config.ToolRunsAfterCancel {
		// The bug: a disconnect neither cancels the tool running nor stops
		// the ones left in the round; only the next model call is spared.
		return context.WithoutCancel(ctx), false
	}
	return ctx, true
}

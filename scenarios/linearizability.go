package scenarios

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/turncheck/turncheck/model"
)

// lineModel is the reference model in porcupine's shape: a conversation's
// Line is the state, a turn is an operation (its outcome and what the
// model saw of it are part of it), and the history is partitioned by
// conversation, which keeps checking fast.
var lineModel = porcupine.Model{
	Partition: byConversation,
	Init:      func() any { return model.Line{} },
	// Next, not Step: the search tries many orders that fail, and needs no
	// violation explained.
	Step: func(state, input, _ any) (bool, any) {
		next, ok := state.(model.Line).Next(input.(*model.Turn))
		return ok, next
	},
	Equal: func(a, b any) bool { return a.(model.Line).Equal(b.(model.Line)) },
	Hash:  func(s any) uint64 { return s.(model.Line).Hash() },
	DescribeOperation: func(input, _ any) string {
		t := input.(*model.Turn)
		if !t.Usable {
			return fmt.Sprintf("no new message -> %s %d", t.Outcome, t.Status)
		}
		saw := "no call"
		for _, c := range t.Calls {
			if c.Turn == t.User {
				saw = "saw " + model.FormatTokens(c.History)
				break
			}
		}
		return fmt.Sprintf("%s -> %s %d (%s)", t.User, t.Outcome, t.Status, saw)
	},
	DescribeState: func(s any) string { return s.(model.Line).String() },
	DescribeOperationMetadata: func(info any) string {
		op := info.(*Op)
		return fmt.Sprintf("step %d: %s", op.Step, op.Send)
	},
}

// byConversation partitions history by conversation, keeping each
// conversation's operations in history order. A history already grouped,
// each conversation's operations in one run (as validate makes it), is cut
// into its runs, windows of the history itself; any other is sorted out
// into windows of one new array: two passes, and one allocation where
// growing a slice per conversation would make many.
func byConversation(history []porcupine.Operation) [][]porcupine.Operation {
	conv := func(k int) model.ConversationRef { return history[k].Input.(*model.Turn).Conv }
	var runs [][]porcupine.Operation
	seen := map[model.ConversationRef]bool{}
	for start, k := 0, 1; start < len(history); k++ {
		if k < len(history) && conv(k) == conv(start) {
			continue
		}
		if seen[conv(start)] {
			return scattered(history)
		}
		seen[conv(start)] = true
		runs = append(runs, history[start:k:k])
		start = k
	}
	return runs
}

// scattered is byConversation for a history not grouped by conversation.
func scattered(history []porcupine.Operation) [][]porcupine.Operation {
	byConv := map[model.ConversationRef]int{}
	part := make([]int, len(history)) // the partition of each operation
	var sizes []int
	for k, op := range history {
		c := op.Input.(*model.Turn).Conv
		i, ok := byConv[c]
		if !ok {
			i = len(sizes)
			byConv[c] = i
			sizes = append(sizes, 0)
		}
		part[k] = i
		sizes[i]++
	}
	all := make([]porcupine.Operation, len(history))
	out := make([][]porcupine.Operation, len(sizes))
	start := 0
	for i, n := range sizes {
		out[i] = all[start : start : start+n]
		start += n
	}
	for k, op := range history {
		out[part[k]] = append(out[part[k]], op)
	}
	return out
}

// linearizability checks histories with porcupine, partitioned by
// conversation. Operations with an unknown outcome are not left pending
// forever: each returns when the client gave up on it, and its Line keeps
// it pending until a later turn of the conversation shows whether it was
// committed.
type linearizability struct {
	// timeout bounds one check; past it the check decides nothing.
	timeout time.Duration
}

// check checks the conversations that the step's turns ran on concurrently
// (two or more of them on one conversation), over the whole history so
// far; a sequential step is decided by the reference model's chain check
// alone. A history porcupine finds illegal is a T4 violation.
func (l *linearizability) check(history []Op, step []model.Turn) *model.Violation {
	perConv := map[model.ConversationRef]int{}
	for _, t := range step {
		perConv[t.Conv]++
	}
	for _, t := range step {
		if perConv[t.Conv] < 2 {
			continue
		}
		perConv[t.Conv] = 0 // once per conversation
		ops := operations(history, &t.Conv)
		if porcupine.CheckOperationsTimeout(lineModel, ops, l.timeout) == porcupine.Illegal {
			return notLinearizable(t.Conv, t.User)
		}
	}
	return nil
}

// notLinearizable is the violation of a conversation porcupine finds no
// order for, found during turn user.
func notLinearizable(conv model.ConversationRef, user model.Token) *model.Violation {
	return &model.Violation{Invariant: model.T4, Conv: conv, Turn: user,
		Reason: "the turns of this conversation cannot be put in one order that agrees both with when each was " +
			"sent and answered and with what the model saw of each: the history is not linearizable"}
}

// validate checks a whole history after the fact: the reference model's
// chain check over all its turns as one step, and linearizability of each
// conversation the chain check does not decide by itself (see
// needsSearch). The chain check's violation comes first; after it, a
// conversation porcupine finds no order for is a T4 violation, named by
// its last turn.
//
// The two checks are independent, so they run at once: porcupine on its
// own goroutines (it checks conversations in parallel anyway), the chain
// check on this one. Where the chain check finds a violation, the search
// is called off rather than waited for: its verdict would not be read.
func validate(history []Op) *model.Violation {
	convs := byConversationIndex(history)
	n := 0
	var search [][]int
	for _, idx := range convs {
		if needsSearch(history, idx) {
			search = append(search, idx)
			n += len(idx)
		}
	}
	ops := make([]porcupine.Operation, 0, n)
	for _, idx := range search {
		for _, i := range idx {
			ops = append(ops, operation(&history[i]))
		}
	}
	var stop atomic.Bool
	lines := lineModel
	lines.Step = func(state, input, output any) (bool, any) {
		if stop.Load() {
			return false, state // called off: fail fast, no verdict read
		}
		return lineModel.Step(state, input, output)
	}
	linearizable := make(chan bool, 1)
	go func() { linearizable <- porcupine.CheckOperations(lines, ops) }()

	turns := make([]model.Turn, len(history))
	for i := range history {
		turns[i] = history[i].Turn
	}
	v := model.New().ApplyStep(turns)
	if v != nil {
		stop.Store(true)
	}
	if ok := <-linearizable; ok || v != nil {
		return v
	}
	// Only a history that fails is checked again, one conversation at a
	// time, to name the one that broke.
	for _, idx := range search {
		var conv []porcupine.Operation
		for _, i := range idx {
			conv = append(conv, operation(&history[i]))
		}
		if !porcupine.CheckOperations(lineModel, conv) {
			last := &history[idx[len(idx)-1]].Turn
			return notLinearizable(last.Conv, last.User)
		}
	}
	panic("scenarios: porcupine rejected a history whose every conversation it accepts")
}

// byConversationIndex groups the positions of history's ops by
// conversation, conversations in order of their first op, each one's
// positions in history order.
func byConversationIndex(history []Op) [][]int {
	id := map[model.ConversationRef]int{}
	conv := make([]int, len(history))
	var sizes []int
	for i := range history {
		c, ok := id[history[i].Turn.Conv]
		if !ok {
			c = len(sizes)
			id[history[i].Turn.Conv] = c
			sizes = append(sizes, 0)
		}
		conv[i] = c
		sizes[c]++
	}
	all := make([]int, len(history))
	out := make([][]int, len(sizes))
	start := 0
	for c, n := range sizes {
		out[c] = all[start : start : start+n]
		start += n
	}
	for i, c := range conv {
		out[c] = append(out[c], i)
	}
	return out
}

// needsSearch reports whether a conversation's linearizability is still
// open once the chain check has accepted the history; idx are the
// positions of the conversation's ops in history, in order. It sorts idx
// by when each op was sent.
//
// It is not open when the conversation's turns never overlapped in time
// and the chain check applied them in the order they were sent. Porcupine
// reads [Invoke, Return] as a closed interval, so two turns overlap unless
// one returned strictly before the other was invoked; when none do, real
// time allows exactly one order, and porcupine's one candidate is to step
// the empty Line through the turns in that order, with Next. The chain
// check stepped the empty Line through the very same turns in the very
// same order (it orders a step's turns by RanAt, ties in the order given,
// and a conversation's Line depends on that conversation's turns alone),
// with Step, which accepts exactly what Next does, and it accepted every
// one: porcupine would accept the conversation. The order has to be
// compared, not assumed: a turn's first call can reach the model after
// its client gave up on it (RanAt past Return), and the chain check then
// follows the server, not real time.
func needsSearch(history []Op, idx []int) bool {
	slices.SortStableFunc(idx, func(i, j int) int { return cmp.Compare(history[i].Turn.Invoke, history[j].Turn.Invoke) })
	for k, i := range idx {
		t := &history[i].Turn
		if t.Return < t.Invoke {
			return true // not an interval: leave it to porcupine
		}
		if k == 0 {
			continue
		}
		j := idx[k-1]
		p := &history[j].Turn
		if p.Return >= t.Invoke {
			return true // they overlapped: several orders to try
		}
		if c := cmp.Compare(p.RanAt(), t.RanAt()); c > 0 || c == 0 && j > i {
			return true // the chain check applied them in another order
		}
	}
	return false
}

// operations turns the history's ops (on conv only, if not nil) into
// porcupine's operations: the client is the op's place in its burst, the
// times are the run's timeline, and the metadata says what was injected.
func operations(history []Op, conv *model.ConversationRef) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(history))
	for i := range history {
		op := &history[i]
		if conv != nil && op.Turn.Conv != *conv {
			continue
		}
		out = append(out, operation(op))
	}
	return out
}

// operation is op as a porcupine operation (see operations).
func operation(op *Op) porcupine.Operation {
	return porcupine.Operation{ClientId: op.Index, Input: &op.Turn,
		Call: op.Turn.Invoke, Return: op.Turn.Return, Metadata: op}
}

// WriteLinearizability writes porcupine's visualisation of history as one
// self-contained HTML page (it opens offline): each conversation's turns as
// intervals per client, the longest linearizable prefix, and the injected
// faults as annotations.
func WriteLinearizability(w io.Writer, history []Op) error {
	ops := operations(history, nil)
	_, info := porcupine.CheckOperationsVerbose(lineModel, ops, time.Minute)
	var notes []porcupine.Annotation
	for _, op := range history {
		if op.Send.faultKind() == "" {
			continue
		}
		notes = append(notes, porcupine.Annotation{
			Tag:   "injected faults",
			Start: op.Turn.Invoke, End: op.Turn.Return,
			Description: fmt.Sprintf("%s: %s", orNone(string(op.Send.Token)), op.Send.faultKind()),
			Details:     fmt.Sprintf("step %d, %s: %s", op.Step, op.Send.Conv, op.Send),
		})
	}
	info.AddAnnotations(slices.Clip(notes))
	return porcupine.Visualize(lineModel, info, w)
}

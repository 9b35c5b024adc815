package scenarios

import (
	"cmp"
	"fmt"
	"io"
	"slices"
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
		next, ok := state.(model.Line).Next(*input.(*model.Turn))
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
// conversation's operations in history order. The partitions are windows
// of one array: two passes over the history, and one allocation where
// growing a slice per conversation would make many.
func byConversation(history []porcupine.Operation) [][]porcupine.Operation {
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
// chain check over all its turns as one step, then linearizability of each
// conversation the chain check has not decided already (see
// needsSearch). A conversation porcupine finds no order for is a T4
// violation, named by its last turn.
func validate(history []Op) *model.Violation {
	turns := make([]model.Turn, len(history))
	for i := range history {
		turns[i] = history[i].Turn
	}
	if v := model.New().ApplyStep(turns); v != nil {
		return v
	}
	byConv := map[model.ConversationRef][]int{}
	var convs []model.ConversationRef // in order of first turn, for a stable verdict
	for i := range history {
		c := history[i].Turn.Conv
		if _, ok := byConv[c]; !ok {
			convs = append(convs, c)
		}
		byConv[c] = append(byConv[c], i)
	}
	var search []model.ConversationRef
	n := 0
	for _, c := range convs {
		if needsSearch(history, byConv[c]) {
			search = append(search, c)
			n += len(byConv[c])
		}
	}
	ops := make([]porcupine.Operation, 0, n)
	for _, c := range search {
		ops = appendOperations(ops, history, byConv[c])
	}
	// All at once, so that porcupine checks the conversations in parallel;
	// only a history that fails is checked again, one conversation at a
	// time, to name the one that broke.
	if porcupine.CheckOperations(lineModel, ops) {
		return nil
	}
	for _, c := range search {
		idx := byConv[c]
		if !porcupine.CheckOperations(lineModel, appendOperations(nil, history, idx)) {
			return notLinearizable(c, history[idx[len(idx)-1]].Turn.User)
		}
	}
	panic("scenarios: porcupine rejected a history whose every conversation it accepts")
}

// appendOperations appends the operations of history's ops at idx to ops,
// as operations makes them.
func appendOperations(ops []porcupine.Operation, history []Op, idx []int) []porcupine.Operation {
	for _, i := range idx {
		ops = append(ops, operation(&history[i]))
	}
	return ops
}

// needsSearch reports whether a conversation's linearizability, once the
// chain check has accepted the history, is still open; idx are the
// positions of the conversation's turns in history, in order.
//
// It is not when the conversation's turns never overlapped in time and the
// chain check applied them in the order they were sent. Porcupine reads
// [Invoke, Return] as a closed interval, so turns overlap unless one
// returned strictly before the other was invoked; when none do, real time
// allows exactly one order, and porcupine's only candidate is stepping the
// conversation's Line through the turns in that order from the empty Line.
// The chain check stepped that very Line through the very same turns from
// the empty Line (it orders turns by RanAt, ties in history order, and a
// conversation's Line depends on that conversation's turns alone), with
// Step, which accepts exactly what the search's Next does, and accepted
// every one: porcupine would accept the conversation. The order has to be
// compared, not assumed: a turn's first call can reach the model after its
// client gave up on it (RanAt past Return), and then the chain check
// follows the server, not real time.
func needsSearch(history []Op, idx []int) bool {
	sorted := slices.Clone(idx)
	slices.SortStableFunc(sorted, func(i, j int) int { return cmp.Compare(history[i].Turn.Invoke, history[j].Turn.Invoke) })
	for k, i := range sorted {
		t := &history[i].Turn
		if t.Return < t.Invoke {
			return true // not an interval porcupine orders by
		}
		if k == 0 {
			continue
		}
		p := &history[sorted[k-1]].Turn
		if p.Return >= t.Invoke {
			return true // they overlapped: several orders to try
		}
		if c := cmp.Compare(p.RanAt(), t.RanAt()); c > 0 || c == 0 && sorted[k-1] > i {
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

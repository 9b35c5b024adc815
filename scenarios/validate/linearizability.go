// Package validate judges the histories of turns sent at once on one
// conversation with porcupine's linearizability checker: some order of the
// turns must explain what each saw.
package validate

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// lineModel is the reference model in porcupine's shape: a conversation's
// Line is the state, a turn is an operation (its outcome and what the
// model saw of it are part of it), and the history is partitioned by
// conversation, which keeps checking fast.
var lineModel = porcupine.Model{
	Partition: byConversation,
	Init:      func() any { return model.Line{} },
	// Next, not Step: the search tries many orders that fail, and needs no
	// violation explained. An operation's output, when it has one, is the
	// step known ahead for it (see validate and linearizable).
	Step: func(state, input, output any) (bool, any) {
		known, _ := output.(*model.Known)
		next, ok := known.Next(state.(model.Line), input.(*model.Turn))
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
		op := info.(*history.Op)
		return fmt.Sprintf("step %d: %s", op.Step, op.Send)
	},
}

// forgettingStep is lineModel's Step for a server that forgets: a turn
// that the line cannot explain may be the first of its conversation
// starting over, after the server forgot it whole.
func forgettingStep(state, input, output any) (bool, any) {
	if ok, next := lineModel.Step(state, input, output); ok {
		return true, next
	}
	return lineModel.Step(model.Line{}, input, nil)
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

// CheckLinearizable checks with porcupine, partitioned by conversation,
// the conversations that the step's turns ran on concurrently (two or more
// of them on one conversation), over the whole history so far; a
// sequential step is decided by the reference model's chain check alone.
// Operations with an unknown outcome are not left pending forever: each
// returns when the client gave up on it, and its Line keeps it pending
// until a later turn shows whether it was committed. A history porcupine
// finds illegal is a T4 violation. No timeout: a verdict must not depend
// on how fast the machine is, and a conversation's history in a run is a
// few dozen turns, at most six at once.
//
// Under forgets (a server whose cache forgets what it evicts), any turn
// may find its conversation forgotten and start over: the model's chain
// check bounds when by the cache's capacity; this check allows it
// anywhere, and so never finds a history broken by that alone.
func CheckLinearizable(history []history.Op, step []model.Turn, forgets bool) *model.Violation {
	m := lineModel
	if forgets {
		m.Step = forgettingStep
	}
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
		if !porcupine.CheckOperations(m, ops) {
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
// chain check over all its turns as one step, and porcupine's check of
// each conversation. The chain check's violation comes first; after it, a
// conversation porcupine finds no order for is a T4 violation, named by
// its last turn (the first such conversation, in order of first turn).
//
// Both checks step each conversation's Line through its turns, and that
// takes reading every call's history: the bulk of the work. So the steps
// of the order the server ran them in, which both checks take (porcupine
// mostly), are taken once, ahead, for several conversations at once
// (stepAhead), and both checks then take them as known. The checks are
// independent, so they run at once: porcupine on a few goroutines, a
// conversation at a time (see linearizable), the chain check on this one.
// Where the chain check finds a violation, the search is called off
// rather than waited for: its verdict would not be read.
func validate(history []history.Op) *model.Violation {
	convs := byConversationIndex(history)
	known := stepAhead(history, convs)
	var stop atomic.Bool
	broken := make([]bool, len(convs)) // porcupine found no order
	searched := make(chan struct{})
	go func() {
		defer close(searched)
		var next atomic.Int64 // the next conversation to check
		var wg sync.WaitGroup
		for range min(runtime.GOMAXPROCS(0), len(convs)) {
			wg.Go(func() {
				for c := int(next.Add(1) - 1); c < len(convs) && !stop.Load(); c = int(next.Add(1) - 1) {
					broken[c] = !linearizable(history, convs[c], known, &stop)
				}
			})
		}
		wg.Wait()
	}()

	turns := make([]model.Turn, len(history))
	for i := range history {
		turns[i] = history[i].Turn
	}
	v := model.New().ApplyStepKnown(turns, known)
	if v != nil {
		stop.Store(true)
	}
	<-searched
	if v != nil {
		return v
	}
	for c, b := range broken {
		if b {
			last := &history[convs[c][len(convs[c])-1]].Turn
			return notLinearizable(last.Conv, last.User)
		}
	}
	return nil
}

// stepAhead takes the steps the chain check will take, for several
// conversations at once: each conversation's Line (convs holds the
// positions of each one's ops in history) through its turns, in the order
// ApplyStep applies them (by RanAt, ties in history order), up to the
// first turn the line refuses. known[i] is the step of history[i], zero
// where none was taken. Taking the steps ahead changes no verdict:
// ApplyStepKnown and Known.Next take a known step only from the very line
// it was taken from, and any other step as they would have.
func stepAhead(history []history.Op, convs [][]int) []model.Known {
	known := make([]model.Known, len(history))
	var next atomic.Int64 // the next conversation to step
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(convs)) {
		wg.Go(func() {
			type ran struct {
				at int64
				i  int
			}
			var order []ran
			for c := int(next.Add(1) - 1); c < len(convs); c = int(next.Add(1) - 1) {
				order = order[:0]
				for _, i := range convs[c] {
					order = append(order, ran{history[i].Turn.RanAt(), i})
				}
				slices.SortFunc(order, func(a, b ran) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.i, b.i)) })
				var line model.Line
				for _, r := range order {
					i := r.i
					k, to, ok := line.Know(&history[i].Turn)
					if !ok {
						break
					}
					known[i], line = k, to
				}
			}
		})
	}
	wg.Wait()
	return known
}

// byConversationIndex groups the positions of history's ops by
// conversation, conversations in order of their first op, each one's
// positions in history order.
func byConversationIndex(history []history.Op) [][]int {
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

// linearizable is porcupine's verdict on one conversation of history
// (idx holds the positions of its turns, in order), with known steps to
// take: porcupine's own search, from where the turns stop being forced.
//
// Porcupine sorts a conversation's calls and returns by time, calls first
// at equal times, and tries, in turn, each call before the first return.
// Where the first turns were each answered strictly before the next was
// sent (forced counts them), the list starts call, return, call, return,
// and the search has no choice to make: it steps the initial Line through
// those turns in order, and fails if one is refused, for nothing else
// comes first. So linearizable takes those steps itself, and searches only
// the rest, from the Line they led to: the same search, without the
// forced turns in each state it remembers. A conversation whose turns
// never overlapped is not searched at all.
//
// Once stop is set, the search is called off: it fails fast, and its
// verdict means nothing.
func linearizable(history []history.Op, idx []int, known []model.Known, stop *atomic.Bool) bool {
	sent := slices.Clone(idx)
	slices.SortStableFunc(sent, func(i, j int) int { return cmp.Compare(history[i].Turn.Invoke, history[j].Turn.Invoke) })
	k := forced(history, sent)
	var line model.Line
	for _, i := range sent[:k] {
		next, ok := known[i].Next(line, &history[i].Turn)
		if !ok {
			return false
		}
		line = next
	}
	if k == len(sent) {
		return true
	}
	// The rest, in history order: every turn sent since the first that is
	// not forced (the forced ones were all sent before it).
	from := history[sent[k]].Turn.Invoke
	var ops []porcupine.Operation
	for _, i := range idx {
		if history[i].Turn.Invoke >= from {
			op := operation(&history[i])
			op.Output = &known[i]
			ops = append(ops, op)
		}
	}
	m := lineModel
	m.Init = func() any { return line }
	m.Step = func(state, input, output any) (bool, any) {
		if stop.Load() {
			return false, state
		}
		return lineModel.Step(state, input, output)
	}
	return porcupine.CheckOperations(m, ops)
}

// forced counts the first turns of a conversation that real time puts in
// one order ahead of all the others: each answered strictly before the
// next one was sent (porcupine reads [Invoke, Return] as a closed
// interval, so turns that touch overlap). sent holds the positions of the
// conversation's turns in history, by when each was sent. Where a turn was
// answered before it was sent, porcupine's event list is out of step with
// when turns were sent, and none is counted.
func forced(history []history.Op, sent []int) int {
	for _, i := range sent {
		if t := &history[i].Turn; t.Return < t.Invoke {
			return 0
		}
	}
	for k, i := range sent {
		if k+1 < len(sent) && history[i].Turn.Return >= history[sent[k+1]].Turn.Invoke {
			return k
		}
	}
	return len(sent)
}

// operations turns the history's ops (on conv only, if not nil) into
// porcupine's operations: the client is the op's place in its burst, the
// times are the run's timeline, and the metadata says what was injected.
func operations(history []history.Op, conv *model.ConversationRef) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(history))
	for i := range history {
		op := &history[i]
		if op.Restart != nil || (conv != nil && op.Turn.Conv != *conv) {
			continue
		}
		out = append(out, operation(op))
	}
	return out
}

// operation is op as a porcupine operation (see operations).
func operation(op *history.Op) porcupine.Operation {
	return porcupine.Operation{ClientId: op.Index, Input: &op.Turn,
		Call: op.Turn.Invoke, Return: op.Turn.Return, Metadata: op}
}

// WriteLinearizability writes porcupine's visualisation of history as one
// self-contained HTML page (it opens offline): each conversation's turns as
// intervals per client, the longest linearizable prefix, and the injected
// faults as annotations.
func WriteLinearizability(w io.Writer, history []history.Op) error {
	ops := operations(history, nil)
	_, info := porcupine.CheckOperationsVerbose(lineModel, ops, time.Minute)
	var notes []porcupine.Annotation
	for _, op := range history {
		if op.Send.FaultKind() == "" {
			continue
		}
		notes = append(notes, porcupine.Annotation{
			Tag:   "injected faults",
			Start: op.Turn.Invoke, End: op.Turn.Return,
			Description: fmt.Sprintf("%s: %s", plan.OrNone(string(op.Send.Token)), op.Send.FaultKind()),
			Details:     fmt.Sprintf("step %d, %s: %s", op.Step, op.Send.Conv, op.Send),
		})
	}
	info.AddAnnotations(slices.Clip(notes))
	return porcupine.Visualize(lineModel, info, w)
}

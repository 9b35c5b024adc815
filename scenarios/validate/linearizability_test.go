package validate

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// simulate returns the history a correct serializing server would give n
// turns sent by clients concurrent clients over convs conversations: each
// client sends one turn at a time; a turn waits for its conversation,
// reaches the model with the conversation's committed history, and ends ok
// (committed), failed, or unknown (committed or not).
func simulate(seed uint64, n, convs, clients int) []history.Op {
	return simulateGivingUp(seed, n, convs, clients, 0)
}

// simulateGivingUp is simulate where a client whose turn the server has not
// taken up yet gives up on it with probability giveUp at each try: the
// turn ends unknown, and the server runs it later all the same, when the
// conversation is free (committed or not), maybe after turns sent after
// it. With giveUp 0 it is simulate, to the draw.
func simulateGivingUp(seed uint64, n, convs, clients int, giveUp float64) []history.Op {
	rng := rand.New(rand.NewPCG(seed, 1))
	type client struct {
		op    *history.Op
		state int // 0 idle, 1 waiting for its conversation, 2 at the model
	}
	var clock int64
	tick := func() int64 { clock++; return clock }
	committed := make([][]model.Token, convs)
	busy := make([]bool, convs)
	cs := make([]client, clients)
	var out []history.Op
	var orphans []*history.Op // given up on, not run yet
	sent := 0
	for sent < n || len(orphans) > 0 || busyClients(cs, func(c client) bool { return c.state != 0 }) {
		if giveUp > 0 && len(orphans) > 0 && rng.IntN(4) == 0 {
			op := orphans[0]
			if conv := convIndex(op.Turn.Conv.ID); !busy[conv] {
				orphans = orphans[1:]
				t := &op.Turn
				history := append(append([]model.Token{}, committed[conv]...), t.User)
				t.Calls = []model.Call{{History: history, Turn: t.User, At: tick()}}
				if rng.IntN(2) == 0 {
					committed[conv] = append(committed[conv], t.User, t.User.Reply())
				}
				out = append(out, *op)
			}
			continue
		}
		k := rng.IntN(clients)
		c := &cs[k]
		switch c.state {
		case 0:
			if sent == n {
				continue
			}
			sent++
			conv := rng.IntN(convs)
			tok := model.UserToken(sent)
			c.op = &history.Op{Index: k, Send: plan.Send{Conv: model.ConversationRef{ID: convID(conv)}, Token: tok}}
			c.op.Turn = model.Turn{Conv: c.op.Send.Conv, User: tok, Usable: true, Invoke: tick()}
			c.state = 1
		case 1:
			conv := convIndex(c.op.Turn.Conv.ID)
			if giveUp > 0 && rng.Float64() < giveUp {
				c.op.Turn.Outcome, c.op.Turn.Return = model.Unknown, tick()
				orphans = append(orphans, c.op)
				c.state = 0
				continue
			}
			if busy[conv] {
				continue
			}
			busy[conv] = true
			history := append(append([]model.Token{}, committed[conv]...), c.op.Turn.User)
			c.op.Turn.Calls = []model.Call{{History: history, Turn: c.op.Turn.User, At: tick()}}
			c.state = 2
		case 2:
			conv := convIndex(c.op.Turn.Conv.ID)
			t := &c.op.Turn
			commit := false
			switch r := rng.IntN(20); {
			case r < 16:
				t.Outcome, t.Status, t.Reply, commit = model.OK, 200, string(t.User.Reply()), true
			case r < 19:
				t.Outcome, t.Status = model.Fail, 502
			default:
				t.Outcome, commit = model.Unknown, rng.IntN(2) == 0
			}
			if commit {
				committed[conv] = append(committed[conv], t.User, t.User.Reply())
			}
			t.Return = tick()
			busy[conv] = false
			out = append(out, *c.op)
			c.state = 0
		}
	}
	return out
}

func busyClients[T any](cs []T, f func(T) bool) bool {
	for _, c := range cs {
		if f(c) {
			return true
		}
	}
	return false
}

func convID(i int) string { return "conv-" + string(rune('A'+i/26)) + string(rune('a'+i%26)) }

func convIndex(id string) int { return int(id[5]-'A')*26 + int(id[6]-'a') }

func TestSimulatedHistoriesPass(t *testing.T) {
	for seed := range uint64(20) {
		h := simulate(seed, 2000, 20, 4)
		require.Len(t, h, 2000)
		require.Nil(t, validate(h), "seed %d", seed)
	}
}

// validateAll is validate as it was first written, the reference the
// tests hold validate to: the chain check, then porcupine over every
// conversation, one after the other.
func validateAll(history []history.Op) *model.Violation {
	turns := make([]model.Turn, len(history))
	for i, op := range history {
		turns[i] = op.Turn
	}
	if v := model.New().ApplyStep(turns); v != nil {
		return v
	}
	if porcupine.CheckOperations(lineModel, operations(history, nil)) {
		return nil
	}
	return &model.Violation{Invariant: model.T4, Reason: "not linearizable"}
}

// lateCall is a conversation whose two turns never overlapped, but whose
// first turn's call reached the model only after its client gave up on it,
// and after the second turn's: the chain check follows the server and
// accepts it, while the only order real time allows does not fit.
func lateCall() []history.Op {
	conv := model.ConversationRef{ID: "c"}
	u1, u2 := model.UserToken(1), model.UserToken(2)
	return []history.Op{
		{Send: plan.Send{Conv: conv, Token: u1}, Turn: model.Turn{Conv: conv, User: u1, Usable: true, Outcome: model.Unknown,
			Calls: []model.Call{{History: []model.Token{u2, u2.Reply(), u1}, Turn: u1, At: 5}}, Invoke: 1, Return: 3}},
		{Send: plan.Send{Conv: conv, Token: u2}, Turn: model.Turn{Conv: conv, User: u2, Usable: true, Outcome: model.OK,
			Status: 200, Reply: string(u2.Reply()),
			Calls: []model.Call{{History: []model.Token{u2}, Turn: u2, At: 4}}, Invoke: 4, Return: 6}},
	}
}

func TestValidateHoldsTurnsThatNeverOverlappedToRealTime(t *testing.T) {
	h := lateCall()
	turns := []model.Turn{h[0].Turn, h[1].Turn}
	require.Nil(t, model.New().ApplyStep(turns), "the chain check accepts it")
	assert.Equal(t, 2, forced(h, []int{0, 1}), "one order only")
	v := validate(h)
	require.NotNil(t, v)
	assert.Equal(t, model.T4, v.Invariant)
	assert.Contains(t, v.Reason, "not linearizable")
	assert.Equal(t, model.UserToken(2), v.Turn, "named by the conversation's last turn")
	assert.NotNil(t, validateAll(h))
}

func TestForced(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	op := func(invoke, ret int64) history.Op {
		return history.Op{Turn: model.Turn{Conv: conv, User: model.UserToken(int(invoke)), Usable: true, Invoke: invoke, Return: ret}}
	}
	for _, tt := range []struct {
		name string
		h    []history.Op
		want int
	}{
		{"one after another", []history.Op{op(1, 3), op(4, 6), op(7, 9)}, 3},
		{"then two at once", []history.Op{op(1, 3), op(4, 6), op(7, 10), op(8, 9), op(11, 12)}, 2},
		{"at once from the start", []history.Op{op(1, 5), op(4, 6), op(7, 9)}, 0},
		{"touching: closed intervals", []history.Op{op(1, 3), op(4, 6), op(6, 7)}, 1},
		{"a long one under the next two", []history.Op{op(1, 2), op(3, 9), op(4, 5), op(6, 7)}, 1},
		{"answered before sent", []history.Op{op(1, 3), op(4, 6), op(9, 8)}, 0},
		{"instant", []history.Op{op(1, 1), op(2, 2)}, 2},
		{"alone", []history.Op{op(1, 3)}, 1},
		{"none", nil, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sent := make([]int, len(tt.h))
			for i := range sent {
				sent[i] = i
			}
			assert.Equal(t, tt.want, forced(tt.h, sent))
		})
	}
}

// TestValidateAgreesWithTheReference: on simulated histories (some with
// clients that give up on turns the server runs later all the same, some
// with one client, whose turns never overlap), broken at random (calls
// moved, histories cut or swapped, turns moved in time), validate reaches
// validateAll's verdict.
func TestValidateAgreesWithTheReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	verdicts := map[string]int{}
	for seed := range uint64(400) {
		h := simulate(seed, 60, 3, 3)
		switch seed % 3 {
		case 1:
			h = simulateGivingUp(seed, 60, 3, 3, 0.2)
		case 2: // one client: no two turns overlap
			h = simulateGivingUp(seed, 40, 3, 1, 0.2)
		}
		for range rng.IntN(3) {
			op := &h[rng.IntN(len(h))].Turn
			switch rng.IntN(5) {
			case 0: // the call arrives late, maybe after the turn ended
				op.Calls[0].At += int64(rng.IntN(20))
			case 1: // the turn is sent and answered at other times
				d := int64(rng.IntN(20) - 10)
				op.Invoke, op.Return = op.Invoke+d, op.Return+d
			case 2: // the call saw less
				if n := len(op.Calls[0].History); n > 1 {
					op.Calls[0].History = op.Calls[0].History[rng.IntN(n-1)+1:]
				}
			case 3: // two turns of a conversation saw each other's history
				o := &h[rng.IntN(len(h))].Turn
				if o.Conv == op.Conv {
					op.Calls[0].History, o.Calls[0].History = o.Calls[0].History, op.Calls[0].History
				}
			case 4: // the turn ended unknown
				op.Outcome = model.Unknown
			}
		}
		want, got := validateAll(h), validate(h)
		verdict := "ok"
		if want != nil {
			verdict = string(want.Invariant)
		}
		verdicts[verdict]++
		require.Equal(t, want == nil, got == nil, "seed %d: want %v, got %v", seed, want, got)
		if want != nil {
			require.Equal(t, want.Invariant, got.Invariant, "seed %d", seed)
			if !strings.Contains(want.Reason, "not linearizable") {
				require.Equal(t, want, got, "seed %d: the chain check's violation", seed)
			}
		}
	}
	t.Logf("verdicts: %v", verdicts)
	assert.Greater(t, verdicts["ok"], 50)
	assert.Greater(t, verdicts["T4"], 5)
}

func TestByConversation(t *testing.T) {
	c := func(id string) porcupine.Operation {
		return porcupine.Operation{Input: &model.Turn{Conv: model.ConversationRef{ID: id}}}
	}
	ids := func(parts [][]porcupine.Operation) [][]string {
		var out [][]string
		for _, p := range parts {
			var ps []string
			for _, op := range p {
				ps = append(ps, op.Input.(*model.Turn).Conv.ID)
			}
			out = append(out, ps)
		}
		return out
	}
	grouped := []porcupine.Operation{c("a"), c("a"), c("b"), c("c"), c("c")}
	parts := byConversation(grouped)
	assert.Equal(t, [][]string{{"a", "a"}, {"b"}, {"c", "c"}}, ids(parts))
	assert.Same(t, &grouped[2], &parts[1][0], "runs are windows of the history")

	scattered := []porcupine.Operation{c("a"), c("b"), c("a"), c("c"), c("b")}
	assert.Equal(t, [][]string{{"a", "a"}, {"b", "b"}, {"c"}}, ids(byConversation(scattered)))
	assert.Empty(t, byConversation(nil))
}

// TestLinearizabilityCatchesAFork: porcupine alone finds two turns that
// ran at once on one history, and lets the same turns pass when the
// second saw the first.
func TestLinearizabilityCatchesAFork(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	u1, u2 := model.UserToken(1), model.UserToken(2)
	turn := func(u model.Token, index int, seen ...model.Token) history.Op {
		return history.Op{Index: index, Send: plan.Send{Conv: conv, Token: u}, Turn: model.Turn{Conv: conv, User: u, Usable: true,
			Outcome: model.OK, Status: 200, Reply: string(u.Reply()),
			Calls: []model.Call{{History: seen, Turn: u}}, Invoke: int64(index + 1), Return: int64(index + 5)}}
	}
	fork := []history.Op{turn(u1, 0, u1), turn(u2, 1, u2)}
	v := CheckLinearizable(fork, []model.Turn{fork[0].Turn, fork[1].Turn}, false)
	require.NotNil(t, v)
	assert.Equal(t, model.T4, v.Invariant)
	assert.Contains(t, v.Reason, "not linearizable")

	line := []history.Op{turn(u1, 0, u1), turn(u2, 1, u1, u1.Reply(), u2)}
	assert.Nil(t, CheckLinearizable(line, []model.Turn{line[0].Turn, line[1].Turn}, false))

	// A lone turn is the chain check's to judge.
	assert.Nil(t, CheckLinearizable(fork, []model.Turn{fork[1].Turn}, false))
}

// TestWriteLinearizability: the visualisation is one self-contained page
// (no script or style fetched from elsewhere) that shows the faults.
func TestWriteLinearizability(t *testing.T) {
	h := simulate(1, 40, 3, 2)
	h[3].Send.Abort = true
	h[5].Send.Fault = faults.Fault{Kind: faults.Status, Status: 502}
	var b bytes.Buffer
	require.NoError(t, WriteLinearizability(&b, h))
	page := b.String()
	assert.Contains(t, page, "<html")
	assert.Contains(t, page, "client-abort")
	assert.Contains(t, page, "model-error")
	assert.NotContains(t, page, `src="http`)
	assert.NotContains(t, page, `href="http`)
}

// BenchmarkChecker measures the checker on a 10,000-turn history over 100
// conversations with 4 concurrent clients: the chain check and porcupine
// together.
func BenchmarkChecker(b *testing.B) {
	h := simulate(7, 10000, 100, 4)
	for b.Loop() {
		if v := validate(h); v != nil {
			b.Fatal(v)
		}
	}
}

// BenchmarkCheckerParts measures the parts of BenchmarkChecker's history
// on their own: the chain check and porcupine over every conversation, each
// stepping every line itself (as validate did first); then validate's
// parts, one at a time: the steps taken ahead, the chain check taking
// them, and porcupine's search, one conversation after another, from
// where each conversation's turns stop being forced.
func BenchmarkCheckerParts(b *testing.B) {
	h := simulate(7, 10000, 100, 4)
	turns := make([]model.Turn, len(h))
	for i, op := range h {
		turns[i] = op.Turn
	}
	b.Run("chain", func(b *testing.B) {
		for b.Loop() {
			if v := model.New().ApplyStep(turns); v != nil {
				b.Fatal(v)
			}
		}
	})
	ops := operations(h, nil)
	b.Run("porcupine", func(b *testing.B) {
		for b.Loop() {
			if !porcupine.CheckOperations(lineModel, ops) {
				b.Fatal("illegal")
			}
		}
	})
	b.Run("operations", func(b *testing.B) {
		for b.Loop() {
			operations(h, nil)
		}
	})
	convs := byConversationIndex(h)
	b.Run("ahead", func(b *testing.B) {
		for b.Loop() {
			stepAhead(h, convs)
		}
	})
	known := stepAhead(h, convs)
	b.Run("chain-known", func(b *testing.B) {
		for b.Loop() {
			if v := model.New().ApplyStepKnown(turns, known); v != nil {
				b.Fatal(v)
			}
		}
	})
	var stop atomic.Bool
	b.Run("search", func(b *testing.B) {
		for b.Loop() {
			for _, idx := range convs {
				if !linearizable(h, idx, known, &stop) {
					b.Fatal("illegal")
				}
			}
		}
	})
}

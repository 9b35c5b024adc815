package scenarios

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
)

// simulate returns the history a correct serializing server would give n
// turns sent by clients concurrent clients over convs conversations: each
// client sends one turn at a time; a turn waits for its conversation,
// reaches the model with the conversation's committed history, and ends ok
// (committed), failed, or unknown (committed or not).
func simulate(seed uint64, n, convs, clients int) []Op {
	rng := rand.New(rand.NewPCG(seed, 1))
	type client struct {
		op    *Op
		state int // 0 idle, 1 waiting for its conversation, 2 at the model
	}
	var clock int64
	tick := func() int64 { clock++; return clock }
	committed := make([][]model.Token, convs)
	busy := make([]bool, convs)
	cs := make([]client, clients)
	var out []Op
	sent := 0
	for sent < n || busyClients(cs, func(c client) bool { return c.state != 0 }) {
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
			c.op = &Op{Index: k, Send: Send{Conv: model.ConversationRef{ID: convID(conv)}, Token: tok}}
			c.op.Turn = model.Turn{Conv: c.op.Send.Conv, User: tok, Usable: true, Invoke: tick()}
			c.state = 1
		case 1:
			conv := convIndex(c.op.Turn.Conv.ID)
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

// TestLinearizabilityCatchesAFork: porcupine alone finds two turns that
// ran at once on one history, and lets the same turns pass when the
// second saw the first.
func TestLinearizabilityCatchesAFork(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	u1, u2 := model.UserToken(1), model.UserToken(2)
	turn := func(u model.Token, index int, history ...model.Token) Op {
		return Op{Index: index, Send: Send{Conv: conv, Token: u}, Turn: model.Turn{Conv: conv, User: u, Usable: true,
			Outcome: model.OK, Status: 200, Reply: string(u.Reply()),
			Calls: []model.Call{{History: history, Turn: u}}, Invoke: int64(index + 1), Return: int64(index + 5)}}
	}
	lin := &linearizability{timeout: time.Minute}
	fork := []Op{turn(u1, 0, u1), turn(u2, 1, u2)}
	v := lin.check(fork, []model.Turn{fork[0].Turn, fork[1].Turn})
	require.NotNil(t, v)
	assert.Equal(t, model.T4, v.Invariant)
	assert.Contains(t, v.Reason, "not linearizable")

	line := []Op{turn(u1, 0, u1), turn(u2, 1, u1, u1.Reply(), u2)}
	assert.Nil(t, lin.check(line, []model.Turn{line[0].Turn, line[1].Turn}))

	// A lone turn is the chain check's to judge.
	assert.Nil(t, lin.check(fork, []model.Turn{fork[1].Turn}))
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
}

package model

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomTurns returns n turns sent one after another on one conversation
// of a server that runs them in order and sometimes misbehaves: outcomes of
// every kind, retries of failed and unknown turns, retried model calls,
// refused requests, and histories that leave out, repeat or reorder what
// the server had committed.
func randomTurns(rng *rand.Rand, n int) []Turn {
	conv := ConversationRef{ID: "c"}
	var committed, retry []Token
	var out []Turn
	for k := range n {
		user := UserToken(k + 1)
		if len(retry) > 0 && rng.IntN(4) == 0 {
			if r := retry[rng.IntN(len(retry))]; !slices.Contains(committed, r) {
				user = r // a client retries only what was not committed
			}
		}
		history := append(slices.Clone(committed), user)
		bad := false
		switch r := rng.IntN(12); {
		case r == 0 && len(history) > 2: // leaves a turn out
			i := rng.IntN(len(history)/2) * 2
			history = slices.Delete(history, i, i+2)
		case r == 1 && len(history) > 2: // repeats a token
			history = slices.Insert(history, rng.IntN(len(history)), history[rng.IntN(len(history)-1)])
		case r == 2 && len(history) > 3: // reorders two tokens
			i, j := rng.IntN(len(history)-1), rng.IntN(len(history)-1)
			history[i], history[j] = history[j], history[i]
		case r == 3: // carries another turn's token
			history = slices.Insert(history, rng.IntN(len(history)), UserToken(rng.IntN(n)+1).Reply())
		}
		bad = bad || !slices.Equal(history, append(slices.Clone(committed), user))
		t := Turn{Conv: conv, User: user, Usable: true, Invoke: int64(3 * k), Return: int64(3*k + 2)}
		for range []int{0, 1, 1, 1, 1, 1, 1, 2}[rng.IntN(8)] {
			t.Calls = append(t.Calls, Call{History: history, Turn: user, At: int64(3*k + 1)})
		}
		if rng.IntN(10) == 0 {
			t.Calls = append(t.Calls, Call{History: []Token{UserToken(999)}, Turn: UserToken(999)})
		}
		commit := false
		switch rng.IntN(10) {
		case 0, 1:
			t.Outcome, t.Status = Fail, []int{409, 502}[rng.IntN(2)]
			retry = append(retry, user)
		case 2:
			t.Outcome, commit = Unknown, rng.IntN(2) == 0
			retry = append(retry, user)
		case 3: // refused: no usable message, maybe replaying one
			t = Turn{Conv: conv, Usable: false, Outcome: Fail, Status: 400, Invoke: t.Invoke, Return: t.Return}
			if rng.IntN(2) == 0 && len(committed) > 0 {
				t.Calls = []Call{{History: slices.Clone(committed), Turn: committed[len(committed)-2]}}
			}
		default:
			t.Outcome, t.Status, t.Reply, commit = OK, 200, "ok: "+string(user.Reply()), len(t.Calls) > 0
			if rng.IntN(20) == 0 {
				t.Reply, bad = "no token", true
			}
		}
		if commit && !bad { // what the model refuses, the server did not commit
			committed = append(committed, user, user.Reply())
		}
		out = append(out, t)
	}
	return out
}

// TestNextIsStep: Next takes the very step Step takes, and fails where
// Step does, on lines of every kind; neither changes the line it is
// called on.
func TestNextIsStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	accepted, refused := 0, 0
	for range 300 {
		var l Line
		for _, turn := range randomTurns(rng, 30) {
			before := l.String()
			got, v := l.Step(turn)
			next, ok := l.Next(&turn)
			require.Equal(t, v == nil, ok, "Step: %v", v)
			require.True(t, reflect.DeepEqual(got, next), "Step: %s, Next: %s", got, next)
			require.Equal(t, before, l.String())
			if v != nil {
				refused++
				require.True(t, reflect.DeepEqual(got, l), "a failed step leaves the line")
				continue
			}
			accepted++
			l = got
		}
	}
	t.Logf("%d steps taken, %d refused", accepted, refused)
	assert.Greater(t, accepted, 1000)
	assert.Greater(t, refused, 500)
}

// failures lists fs's entries, newest first, checking each one's users
// mask on the way.
func failures(t *testing.T, fs *failure) []Token {
	t.Helper()
	var out []Token
	for f := fs; f != nil; f = f.next {
		want := uint64(0)
		for g := f; g != nil; g = g.next {
			want |= tokenBit(g.user)
		}
		require.Equal(t, want, f.users, "mask of the list from %s", f.user)
		out = append(out, f.user)
	}
	return out
}

func TestWithoutFailure(t *testing.T) {
	var fs *failure
	var users []Token
	for k := 1; k <= 40; k++ { // 40 tokens in 64 bits: some share one
		fs = newFailure(UserToken(k), 500+k, fs)
		users = append([]Token{UserToken(k)}, users...)
	}
	for i, user := range users {
		got := withoutFailure(fs, user)
		assert.Equal(t, slices.Delete(slices.Clone(users), i, i+1), failures(t, got))
		assert.Equal(t, users, failures(t, fs), "the list it was taken from is unchanged")
		// Only the entries before it are copied: the rest is shared.
		after, rest := fs, got
		for range i + 1 {
			after = after.next
		}
		for range i {
			rest = rest.next
		}
		assert.Same(t, after, rest)
	}
	assert.Same(t, fs, withoutFailure(fs, UserToken(41)), "nothing to remove: the same list")
	var l0 Line
	for _, status := range []int{502, 409} { // a turn that failed twice, then went through
		l0, _ = l0.Step(Turn{User: UserToken(1), Usable: true, Outcome: Fail, Status: status})
	}
	assert.Equal(t, 409, l0.failedWith(UserToken(1)), "its latest failure")
	l0, v := l0.Step(Turn{User: UserToken(1), Usable: true, Outcome: Unknown})
	require.Nil(t, v)
	assert.Equal(t, 0, l0.failedWith(UserToken(1)), "no failure left")
	assert.Nil(t, withoutFailure(nil, UserToken(1)))
	l := Line{rare: &rare{failed: withoutFailure(fs, UserToken(7))}}
	assert.Equal(t, 0, l.failedWith(UserToken(7)))
	assert.Equal(t, 508, l.failedWith(UserToken(8)))
}

// TestKnown: a known step is taken only from the very line it was taken
// from, and only with its turn or a copy of it; from anywhere else, or
// with another turn, the step is taken anew.
func TestKnown(t *testing.T) {
	conv := ConversationRef{ID: "c"}
	turn := func(user Token, history ...Token) Turn {
		return Turn{Conv: conv, User: user, Usable: true, Outcome: OK, Status: 200, Reply: string(user.Reply()),
			Calls: []Call{{History: append(history, user), Turn: user}}}
	}
	u1, u2 := UserToken(1), UserToken(2)
	t1 := turn(u1)
	var l Line
	k, to, ok := l.Know(&t1)
	require.True(t, ok)
	got, ok := k.Next(l, &t1)
	require.True(t, ok)
	assert.Same(t, to.last, got.last, "known: the very line it led to")
	cp := t1
	got, _ = k.Next(l, &cp)
	assert.Same(t, to.last, got.last, "a copy of the turn is the turn")

	t2 := turn(u2, u1, u1.Reply())
	k2, to2, ok := to.Know(&t2)
	require.True(t, ok)
	again, _ := l.Step(t1) // an Equal line, not the same one
	require.True(t, again.Equal(to))
	got, ok = k2.Next(again, &t2)
	require.True(t, ok)
	assert.NotSame(t, to2.last, got.last, "from an Equal line: taken anew")

	wrong := turn(u2, u1) // the reply left out: refused
	_, ok = k2.Next(to, &wrong)
	assert.False(t, ok, "another turn: taken anew, and refused")
	wrong = t2
	wrong.Outcome = Fail
	got, ok = k2.Next(to, &wrong)
	require.True(t, ok)
	assert.Equal(t, to.String(), got.String(), "another outcome: taken anew")

	_, _, ok = to.Know(&wrong)
	require.True(t, ok)
	_, _, ok = l.Know(&t2)
	assert.False(t, ok, "a refused step is not kept")
	var none *Known
	got, ok = none.Next(to, &t2)
	require.True(t, ok)
	assert.Equal(t, to2.String(), got.String())
}

// TestApplyStepKnown: whatever steps it is given, ApplyStepKnown reaches
// ApplyStep's verdict, and takes the steps it can.
func TestApplyStepKnown(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	used := 0
	for range 300 {
		turns := randomTurns(rng, 20)
		// Steps known ahead as validate takes them, then some moved to other
		// turns, or taken from other lines.
		known := make([]Known, len(turns))
		var l Line
		for i := range turns {
			k, to, ok := l.Know(&turns[i])
			if !ok {
				break
			}
			known[i], l = k, to
			if turns[i].Outcome == OK && rng.IntN(4) == 0 {
				// The step of another turn from the same line: had it failed.
				failed := turns[i]
				failed.Outcome = Fail
				known[i], _, _ = known[i].from.Know(&failed)
			}
		}
		for range rng.IntN(3) {
			i, j := rng.IntN(len(known)), rng.IntN(len(known))
			known[i] = known[j]
		}
		want := New().ApplyStep(slices.Clone(turns))
		m := New()
		got := m.ApplyStepKnown(slices.Clone(turns), known)
		require.Equal(t, want, got)
		for i := range known {
			if known[i].turn != nil && m.convs[turns[0].Conv].line.last == known[i].to.last {
				used++
				break
			}
		}
	}
	assert.Greater(t, used, 50, "known steps taken")
}

func TestReplyIn(t *testing.T) {
	long := Token("tc-u" + strings.Repeat("7", 40)) // longer than the stack buffer
	for _, tt := range []struct {
		text string
		user Token
		ok   bool
	}{
		{"sure: tc-a12.", "tc-u12", true},
		{"tc-a123 tc-a1", "tc-u12", false},
		{"x" + string(long.Reply()), long, false},
		{"x " + string(long.Reply()), long, true},
		{"plain", "plain", true},
		{"", "tc-u1", false},
	} {
		got, ok := replyIn(tt.text, tt.user)
		assert.Equal(t, tt.ok, ok, "%q in %q", tt.user, tt.text)
		if ok {
			assert.Equal(t, tt.user.Reply(), got)
		}
	}
}

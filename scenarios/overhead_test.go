//go:build unix

package scenarios

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// BenchmarkCheckOverhead measures what a check costs before and after its
// steps, on the reference server run as a subprocess: one server reused
// for every check under namespaces of conversation ids (the default), or a
// fresh server per check (fresh_per_check). Each op is one check of one
// plain turn; "turn" is that turn alone in a session already open, so a
// check's overhead is its ns/op minus turn's.
func BenchmarkCheckOverhead(b *testing.B) {
	bin := testbin.Turncheck(b)
	target := func(fresh bool) targets.Subprocess {
		return targets.Subprocess{
			Command: []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}",
				"--key", "key-a", "--key", "key-b"},
			FreshPerCheck: fresh,
			Reaches:       reference.Target{}.Profile(),
		}
	}
	plain := plan.Single("continue", plan.TurnSend(model.ConversationRef{Key: "key-a", ID: "conv-1"}, model.UserToken(1), false))
	check := func(b *testing.B, fresh bool) {
		l, err := execute.Open(target(fresh), nil)
		require.NoError(b, err)
		defer func() { require.NoError(b, l.Close()) }()
		b.ResetTimer()
		for range b.N {
			s, err := l.Session(nil)
			require.NoError(b, err)
			_, v := s.Step(plain)
			require.Nil(b, v)
			require.NoError(b, s.Close())
		}
	}
	b.Run("reuse", func(b *testing.B) { check(b, false) })
	b.Run("fresh", func(b *testing.B) { check(b, true) })
	b.Run("turn", func(b *testing.B) {
		l, err := execute.Open(target(false), nil)
		require.NoError(b, err)
		defer func() { require.NoError(b, l.Close()) }()
		s, err := l.Session(nil)
		require.NoError(b, err)
		defer func() { require.NoError(b, s.Close()) }()
		b.ResetTimer()
		for i := range b.N {
			_, v := s.Step(plan.Single("continue", plan.TurnSend(model.ConversationRef{Key: "key-a", ID: "conv-1"}, model.UserToken(i+1), false)))
			require.Nil(b, v)
		}
	})
}

// BenchmarkCrashRestart measures the time from kill -9 of the reference
// server, run as a subprocess, to the restarted server answering, on a
// data dir holding a few committed conversations.
func BenchmarkCrashRestart(b *testing.B) {
	bin := testbin.Turncheck(b)
	target := targets.Subprocess{
		Command: []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}",
			"--key", "key-a", "--key", "key-b", "--agent={agents}"},
		Agent:   reference.Target{}.Profile().Agent,
		Reaches: reference.Target{}.Profile(),
	}
	l, err := execute.Open(target, nil)
	require.NoError(b, err)
	defer func() { require.NoError(b, l.Close()) }()
	s, err := l.Session(nil)
	require.NoError(b, err)
	defer func() { require.NoError(b, s.Close()) }()
	for i := range 10 {
		conv := model.ConversationRef{Key: "key-a", ID: "conv-" + string(rune('a'+i))}
		_, v := s.Step(plan.Single("continue", plan.TurnSend(conv, model.UserToken(i+1), false)))
		require.Nil(b, v)
	}
	crash := plan.Plan{Action: "crash", Restart: &plan.Restart{Crash: true}}
	b.ResetTimer()
	for range b.N {
		ops, v := s.Step(crash)
		require.Nil(b, v, "%+v", ops)
	}
}

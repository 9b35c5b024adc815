package sut

import (
	"context"
	"strings"
	"sync"

	"github.com/turncheck/turncheck/internal/openai"
)

// titlePrompt is the instruction of a title call.
const titlePrompt = "Write a short title for a conversation whose user wrote the messages below."

// title returns what starts the turn's title call (Config.Titles) and what
// ends it. The call runs beside the turn's tool loop, as a server naming
// its conversations does, once the turn's first model call has answered:
// it carries the conversation's user messages only, this turn's last. Its
// answer is not kept: a title is not conversation state, and a failed one
// changes nothing. end cancels the call if it is still running and waits
// for it, so that it never outlives its turn.
func (s *Server) title(ctx context.Context, t *turn) (start, end func()) {
	if !s.cfg.Titles {
		return func() {}, func() {}
	}
	var users []string
	for _, m := range t.work.messages {
		if !m.hidden && m.Role == openai.RoleUser {
			users = append(users, string(m.Content))
		}
	}
	history := []openai.Message{
		{Role: openai.RoleSystem, Content: openai.Content(titlePrompt)},
		{Role: openai.RoleUser, Content: openai.Content(strings.Join(users, "\n"))},
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		once sync.Once
		done = make(chan struct{})
	)
	start = func() {
		once.Do(func() {
			go func() {
				defer close(done)
				_, _ = s.up.complete(ctx, history, nil, reservationOf(ctx), func() {}, func(string) {})
			}()
		})
	}
	end = func() {
		cancel()
		once.Do(func() { close(done) })
		<-done
	}
	return start, end
}

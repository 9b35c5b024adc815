package turn

import (
	"context"
	"strings"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/admission"
)

// titlePrompt is the instruction of a title call.
const titlePrompt = "Write a short title for a conversation whose user wrote the messages below."

// title starts the turn's title call (Config.Titles) and returns what
// ends it. The call runs beside the turn's tool loop from its start, as
// docker-agent's session API names its sessions: it carries the
// conversation's user messages only, this turn's last, and races the
// turn's own first call to the model. Its answer is not kept: a title is
// not conversation state, and a failed one changes nothing. end cancels
// the call if it is still running and waits for it, so that it never
// outlives its turn.
func (s *Engine) title(ctx context.Context, t *Turn) (end func()) {
	if !s.Cfg.Titles {
		return func() {}
	}
	var users []string
	for _, m := range t.Work.Messages {
		if !m.Hidden && m.Role == openai.RoleUser {
			users = append(users, string(m.Content))
		}
	}
	history := []openai.Message{
		{Role: openai.RoleSystem, Content: openai.Content(titlePrompt)},
		{Role: openai.RoleUser, Content: openai.Content(strings.Join(users, "\n"))},
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Up.complete(ctx, history, nil, admission.ReservationOf(ctx), func() {}, func(string) {})
	}()
	return func() {
		cancel()
		<-done
	}
}

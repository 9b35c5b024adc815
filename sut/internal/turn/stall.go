package turn

import (
	"context"

	"github.com/turncheck/turncheck/internal/stall"
)

// stall pauses for a random 0..Config.Stall (stall.Sleep): at the points
// where a busy machine leaves a turn waiting longest, before a model call,
// before a commit and before each write to the client (and before a turn
// sees its client gone: noticed). It ends early when
// ctx ends or the server crashes, so that a stalled server still stops
// at once. With Stall 0 it returns at once.
func (s *Engine) stall(ctx context.Context) {
	stall.Sleep(ctx, s.Cfg.Stall, s.life.Done())
}

// noticed is the request context rctx as the turn sees it: with Stall
// set, it ends a random 0..Stall after rctx does, as on a busy machine
// the goroutine that notices a client gone runs late; the turn must
// still stop once it sees it. Without Stall it is rctx.
func (s *Engine) noticed(rctx context.Context) context.Context {
	if s.Cfg.Stall <= 0 {
		return rctx
	}
	late, cancel := context.WithCancelCause(context.WithoutCancel(rctx))
	context.AfterFunc(rctx, func() {
		stall.Sleep(context.Background(), s.Cfg.Stall, s.life.Done())
		cancel(context.Cause(rctx))
	})
	return late
}
